"""Mask schedules: specs that change with the optimizer's step count, inside the step."""

import keras
import numpy as np

from maskfit import checks
from maskfit.spec import masks as specs

__all__ = ["PiecewiseMask", "interval_at"]


def interval_at(boundaries, step):
    """The interval of a schedule that optimizer step `step` is in (on the host).

    Interval `i` holds while `boundaries[i - 1] <= step < boundaries[i]`; the
    compiled step does the same lookup with `tf.searchsorted`
    (`maskfit.step.mask_state.MaskState.select`).

    Example:

    >>> interval_at((100, 200), 99), interval_at((100, 200), 100)
    (0, 1)
    """
    return int(np.searchsorted(boundaries, step, side="right"))


def _of_first_spec(name, doc=None):
    """A property of a schedule read from its first interval's spec."""
    return property(lambda self: getattr(self.specs[0], name), doc=doc)


@keras.saving.register_keras_serializable(package="maskfit")
class PiecewiseMask(specs.GradMaskSpec):
    """A mask that switches between specs at given optimizer steps.

    Spec `specs[i]` holds while `boundaries[i - 1] <= step < boundaries[i]`,
    where `step` is the optimizer's `iterations` before the update (the number
    of updates applied so far; with `gradient_accumulation_steps`, the number
    of accumulated updates). The switch happens inside the compiled training
    step, at the exact step, also with `steps_per_execution > 1`, with no
    callback and no retrace. It survives save and load with the model.

    All specs must be of one kind and shape: `OutputMask`s of one length (and
    one `backprop` setting), or `ElementMask`s naming the same variables with
    the same shapes.

    Args:
      boundaries: strictly increasing positive integers, the steps at which
        the next spec takes over.
      specs: `len(boundaries) + 1` mask specs.

    Example (gradual unfreezing: the head learns at once, the body from step 100):

    >>> import maskfit
    >>> body_schedule = maskfit.PiecewiseMask(
    ...     boundaries=[100],
    ...     specs=[maskfit.OutputMask([0] * 8), maskfit.OutputMask([1] * 8)])
    >>> body_schedule.spec_at(99).values.tolist() == [0.0] * 8
    True
    >>> body_schedule.spec_at(100).values.tolist() == [1.0] * 8
    True
    """

    def __init__(self, boundaries, specs):
        self.boundaries = _check_boundaries(boundaries)
        self.specs = tuple(_check_specs(specs, len(self.boundaries)))

    def schedule(self):
        return self.boundaries, self.specs

    # What every interval's spec agrees on (`_signature`), read from the first.
    backprop = _of_first_spec("backprop")
    scale = _of_first_spec("scale")
    units = _of_first_spec("units")
    values = _of_first_spec(
        "values", "The first interval's values (an `OutputMask` schedule)."
    )

    def spec_at(self, step):
        """Returns the spec in force at optimizer step `step`."""
        return self.specs[interval_at(self.boundaries, step)]

    def check_layer(self, layer):
        for spec in self.specs:
            spec.check_layer(layer)

    def resolve(self, layer):
        """Resolves the first interval's spec; see `GradMaskSpec.resolve`."""
        return self.specs[0].resolve(layer)

    def get_config(self):
        return {
            "boundaries": list(self.boundaries),
            "specs": [keras.saving.serialize_keras_object(s) for s in self.specs],
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["specs"] = [
            keras.saving.deserialize_keras_object(s) for s in config["specs"]
        ]
        return cls(**config)

    def __repr__(self):
        boundaries, intervals = list(self.boundaries), list(self.specs)
        return f"PiecewiseMask(boundaries={boundaries}, specs={intervals})"


def _check_boundaries(boundaries):
    try:
        values = list(boundaries)
    except TypeError:
        values = None
    if (
        not values
        or not all(checks.is_integer(b) for b in values)
        or any(b <= 0 for b in values)
        or any(b >= c for b, c in zip(values, values[1:]))
    ):
        raise ValueError(
            "PiecewiseMask boundaries must be a non-empty list of strictly"
            " increasing positive integers (optimizer steps), e.g. [100, 200]."
            f" Received: boundaries={boundaries!r}"
        )
    return tuple(int(b) for b in values)


def _signature(spec):
    """What must agree between the specs of one schedule."""
    if isinstance(spec, specs.OutputMask):
        return ("OutputMask", spec.units, spec.backprop, spec.scale)
    shapes = tuple(sorted((k, v.shape) for k, v in spec.masks.items()))
    return ("ElementMask", shapes, spec.scale)


def _check_specs(schedule_specs, num_boundaries):
    schedule_specs = list(schedule_specs)
    if len(schedule_specs) != num_boundaries + 1:
        raise ValueError(
            f"PiecewiseMask needs one spec per interval: {num_boundaries} boundaries"
            f" make {num_boundaries + 1} intervals, but {len(schedule_specs)} specs"
            " were given."
        )
    for i, spec in enumerate(schedule_specs):
        if not isinstance(spec, (specs.OutputMask, specs.ElementMask)):
            raise TypeError(
                "PiecewiseMask specs must be maskfit.OutputMask or"
                f" maskfit.ElementMask. Received specs[{i}]={spec!r}"
            )
    first = _signature(schedule_specs[0])
    for i, spec in enumerate(schedule_specs[1:], start=1):
        if _signature(spec) != first:
            raise ValueError(
                "PiecewiseMask specs must all be of one kind, shape and scale so that they"
                f" fit the same layer: specs[0] is {first}, but specs[{i}] is"
                f" {_signature(spec)}."
            )
    return schedule_specs
