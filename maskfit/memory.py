"""`mask_memory`: the bytes of masks each device holds, beside the variables they mask."""

import dataclasses
from typing import NamedTuple

from maskfit import support

__all__ = ["MaskMemory", "MaskMemoryRow", "mask_memory"]


class MaskMemoryRow(NamedTuple):
    """One masked variable: the bytes its masks and it hold, per device.

    Attributes:
      path: the variable's path.
      masks: `{device: bytes}` of its masks as the training step holds them
        (the declared mask's table and schedule, a rule's keep mask; a mask
        an `OutputMask` shares between a layer's variables counts at one).
      variable: `{device: bytes}` of the variable itself.

    Example:

    >>> row = MaskMemoryRow("dense/kernel", {"cpu:0": 12}, {"cpu:0": 48})
    >>> row.masks["cpu:0"] / row.variable["cpu:0"]
    0.25
    """

    path: str
    masks: dict
    variable: dict


@dataclasses.dataclass(frozen=True)
class MaskMemory:
    """What a model's masks cost each device, beside the variables they mask.

    Under `keras.distribution.ModelParallel` (JAX) a mask is laid out like its
    variable, so each device holds the shard of the mask that goes with its
    shard of the kernel; a replicated variable (`DataParallel`,
    `MirroredStrategy`) has its mask on every replica.

    Attributes:
      rows: one `MaskMemoryRow` per masked variable, in the model's order.
      masks: `{device: bytes}` of all the masks.
      variables: `{device: bytes}` of the masked variables.

    Example:

    >>> memory = MaskMemory((), {"cpu:0": 128, "cpu:1": 64}, {"cpu:0": 512, "cpu:1": 512})
    >>> memory.ratio
    0.25
    """

    rows: tuple
    masks: dict
    variables: dict

    @property
    def ratio(self):
        """The largest, over devices, of mask bytes per byte of masked variables."""
        return max(
            (self.masks.get(d, 0) / n for d, n in self.variables.items() if n),
            default=0.0,
        )


def mask_memory(model, print_fn=print):
    """Prints, and returns, the bytes of masks each device holds for `model`.

    Per masked variable and per device: the bytes of the masks the training
    step is given or keeps (masks of 0s and 1s as booleans, a schedule's
    masks and boundaries, a rule's keep masks) and of the variable itself,
    read from the arrays: on JAX from each array's shards (under a
    `keras.distribution`, laid out like their variables), on TensorFlow
    from the step's mask state (each replica's copy under a strategy,
    once the step is planned by `fit`; empty before).

    Args:
      model: a `MaskedModel` (on JAX any model with masks declared).
      print_fn: called with each line of the table; `None` prints nothing.

    Returns:
      A `MaskMemory`.

    Raises:
      NotImplementedError: under torch (`maskfit.support.FEATURES`).

    Example:

    >>> import keras, numpy as np, maskfit
    >>> inputs = keras.Input((3,))
    >>> dense = maskfit.set_mask(
    ...     keras.layers.Dense(4, name="dense"),
    ...     maskfit.ElementMask({"kernel": np.eye(3, 4)}))
    >>> model = maskfit.MaskedModel(inputs, dense(inputs))
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> _ = model.fit(np.ones((2, 3)), np.ones((2, 4)), verbose=0)
    >>> memory = maskfit.mask_memory(model, print_fn=None)
    >>> [(row.path, sum(row.masks.values())) for row in memory.rows]
    [('dense/kernel', 12)]
    >>> memory.ratio  # 12 booleans beside 12 float32s
    0.25
    """
    support.require("mask_memory")
    rows = tuple(
        MaskMemoryRow(*row) for row in support.step_backend().mask_memory(model)
    )
    result = MaskMemory(
        rows, _total(r.masks for r in rows), _total(r.variable for r in rows)
    )
    if print_fn is not None:
        devices = sorted(result.variables)
        print_fn(f'Mask memory per device: "{model.name}"')
        for device in devices:
            held, weights = result.masks.get(device, 0), result.variables[device]
            print_fn(
                f" {device}: masks {held:,} bytes, masked variables {weights:,} bytes"
                f" ({held / weights if weights else 0:.3f})"
            )
    return result


def _total(dicts):
    found = {}
    for each in dicts:
        for device, size in each.items():
            found[device] = found.get(device, 0) + size
    return found
