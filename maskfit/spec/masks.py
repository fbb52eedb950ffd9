"""Gradient-mask specs: what may learn in a layer, declared as plain data."""

import abc

import keras
import numpy as np

from maskfit import checks
from maskfit.spec.config_value import ConfigValue
from maskfit.units import layout as layout_lib
from maskfit.units import lookup

__all__ = ["GradMaskSpec", "OutputMask", "ElementMask", "as_grad_mask_spec"]


def _check_values(values, what):
    """Returns `values` as a float32 array, or raises if any is negative or not finite."""
    try:
        array = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{what} must be numbers (a list or array of 0/1 or values in between)."
            f" Received: {values!r}"
        ) from e
    if not np.all(np.isfinite(array)):
        bad = np.flatnonzero(~np.isfinite(array.ravel()))[:5].tolist()
        raise ValueError(
            f"{what} must be finite; entries at flat positions {bad} are not."
            f" Received: {values!r}"
        )
    if np.any(array < 0):
        bad = np.flatnonzero(array.ravel() < 0)[:5].tolist()
        raise ValueError(
            f"{what} must be >= 0 (1 learns, 0 is frozen, other values multiply"
            f" the learning rate); entries at flat positions {bad} are negative."
            f" Received: {values!r}"
        )
    return array


def _element_values(values, what):
    """Returns an `ElementMask`'s values: bool (one byte per entry) when all are 0 or 1.

    A bool array is kept as given (not copied), as a float32 one always was;
    other values are checked as `_check_values` does, and kept as float32
    when any lies between 0 and 1 or above.
    """
    if isinstance(values, np.ndarray) and values.dtype == np.bool_:
        return values
    array = _check_values(values, what)
    if np.all((array == 0) | (array == 1)):
        return array != 0
    return array


class GradMaskSpec(ConfigValue, abc.ABC):
    """Base class of gradient-mask specs; see `OutputMask` and `ElementMask`.

    A spec is plain data: equal to another of its class with the same
    `get_config()` (`ConfigValue`).
    """

    @abc.abstractmethod
    def resolve(self, layer):
        """Maps each trainable variable of `layer` that the spec covers to its mask.

        Args:
            layer: a built Keras layer.

        Returns:
            A list of `(variable, mask, kind)` with `mask` a float32 array (or,
            for an `ElementMask` of 0s and 1s, a bool one) that broadcasts
            against the variable, and `kind` `"output"` or `"element"`.

        Raises:
            ValueError: when the spec does not fit the layer's variables.
        """

    def check_layer(self, layer):
        """Raises early when the spec cannot fit `layer`; built layers fully."""
        trainable = [v for v in layer.trainable_weights]
        if layer.built and not trainable:
            raise ValueError(
                f"Layer '{layer.name}' has no trainable variables, so a gradient mask"
                f" on it would do nothing. Received: {self!r}. Put the mask on a"
                " layer that has trainable weights, or make the layer trainable."
            )
        if layer.built:
            self.resolve(layer)

    def schedule(self):
        """Returns `(boundaries, specs)`: the specs in force between the steps.

        A plain spec holds at every step: `((), (self,))`. Schedules override it.
        """
        return (), (self,)

    @property
    def backprop(self):
        """Whether the spec also gates the gradient flowing upstream."""
        return False

    @property
    def scale(self):
        """What a value other than 0 and 1 scales: "step" (the learning rate) or "gradient"."""
        return getattr(self, "_scale", "step")

    @abc.abstractmethod
    def get_config(self):
        """Returns the spec's constructor arguments as plain Python data."""


@keras.saving.register_keras_serializable(package="maskfit")
class OutputMask(GradMaskSpec):
    """Lets only some output units of a layer learn.

    One value per output unit of the layer (its channels, features or units:
    the unit axis of its output, e.g. axis 1 for `channels_first`). An entry of
    a parameter belongs to output unit `u` when it affects unit `u` and no
    other unit in one call of the layer (for recurrent layers, in one cell
    step): a Dense kernel's column, a transposed convolution's `[..., u, :]`
    slice, a depthwise kernel's `[..., c, m]` for channel `c * multiplier + m`,
    an LSTM's column of `u` in every gate block. Each such entry gets its
    unit's value: 1 learns, 0 is frozen (it stays bit-identical under any
    optimizer), and any other value m is a learning-rate multiplier: the
    entry learns as under its own optimizer at learning rate x m (weight
    decay included; see `scale`). Entries shared by
    several units (attention query and key kernels, a LoRA `A` matrix, a
    separable convolution's depthwise kernel) keep learning, and
    `maskfit.summary` counts them as shared.

    Which entries belong to which unit comes from the layer's real structure
    (the records of `maskfit.kinds` for the built-in Keras layers; a declaration
    for your own, see `maskfit.OutputUnits`), and is checked against the layer's
    gradients on random inputs once. A layer maskfit cannot serve is refused
    with an error, never guessed (docs/output_mask.md lists every Keras
    layer). It costs O(units) memory, whatever the size of the variables.

    Args:
        values: one non-negative finite number per output unit.
        backprop: if True, the gradient that arrives at the frozen units'
            outputs (along the output's unit axis) is blocked as well, so no
            upstream layer learns from those units either (with
            `scale="gradient"`, values in between scale it). The forward value
            is unchanged.
        scale: "step" (the default): m multiplies the optimizer's learning
            rate for the entries (docs/learning_rates.md has what that means
            per optimizer); "gradient": m multiplies their gradient, which an
            adaptive optimizer (Adam) divides out again.

    Example:

    >>> import keras, maskfit
    >>> inputs = keras.Input((1,))
    >>> hidden = keras.layers.Dense(16, activation="relu")(inputs)
    >>> head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> model = maskfit.MaskedModel(inputs, head(hidden))
    >>> maskfit.get_mask(head).values.tolist()
    [1.0, 0.0]
    """

    def __init__(self, values, backprop=False, scale="step"):
        self._scale = _check_scale(scale, "OutputMask")
        array = _check_values(values, "OutputMask values")
        if array.ndim != 1 or array.size == 0:
            raise ValueError(
                "OutputMask values must be a non-empty 1-D list, one value per output"
                f" unit. Received shape {array.shape}: {values!r}"
            )
        if not isinstance(backprop, (bool, np.bool_)):
            raise TypeError(
                f"OutputMask backprop must be True or False. Received: {backprop!r}"
            )
        self.values = array
        self._backprop = bool(backprop)

    @property
    def backprop(self):
        return self._backprop

    @property
    def units(self):
        return int(self.values.shape[0])

    def check_layer(self, layer):
        """Checks the mask against `layer`: fully if built, else what is known.

        An unbuilt layer is checked for a declaration and, where its config
        tells, its number of units; the rest is checked when it is planned.
        """
        if layer.built and not layer.trainable_weights:
            super().check_layer(layer)
        if not layer.built:
            self._check_length(layer, lookup.units_before_build(layer))
            return
        self.layer_units(layer)

    def _check_length(self, layer, units):
        if units is not None and units != self.units:
            raise ValueError(
                f"OutputMask on layer '{layer.name}' has {self.units} values but the"
                f" layer ({type(layer).__name__}) has {units} output units. Pass one"
                " value per output unit."
            )

    def layer_units(self, layer):
        """Returns the layer's checked `LayerUnits`; raises if they do not fit.

        Raises:
          ValueError: when the layer is refused (see `maskfit.OutputUnits`) or
            the number of values is not its number of output units.
        """
        resolved = layout_lib.layer_units(layer)
        self._check_length(layer, resolved.units)
        return resolved

    def resolve(self, layer):
        """Returns `(variable, mask, "output")` for the variables with owned entries.

        `mask` broadcasts against the variable; shared entries are 1.
        """
        return [
            (variable, layout.expand_numpy(self.values), "output")
            for variable, layout in self.layer_units(layer).layouts
            if layout is not None
        ]

    def get_config(self):
        return {
            "values": self.values.tolist(),
            "backprop": self.backprop,
            "scale": self.scale,
        }

    def __repr__(self):
        scale = "" if self.scale == "step" else f", scale={self.scale!r}"
        return f"OutputMask({self.values.tolist()}, backprop={self.backprop}{scale})"


@keras.saving.register_keras_serializable(package="maskfit")
class ElementMask(GradMaskSpec):
    """Sets, entry by entry, which parts of named variables of a layer learn.

    Args:
        masks: a dict from a variable's name (`variable.name`, e.g. `"kernel"`,
            or its full `variable.path`) to an array of the variable's shape (or
            one that broadcasts to it). 1 learns, 0 is frozen, any other value
            m is a learning-rate multiplier (see `scale`). Variables of the
            layer not named here learn freely. Values that are all 0 or 1 are
            held as bool, one byte per entry (a bool array as given, not
            copied); others as float32.
        scale: "step" (the default): m multiplies the optimizer's learning
            rate for the entries; "gradient": m multiplies their gradient.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> dense = keras.layers.Dense(3)
    >>> dense.build((None, 2))
    >>> keep = np.array([[1, 0, 1], [0, 1, 0]])
    >>> _ = maskfit.set_mask(dense, maskfit.ElementMask({"kernel": keep}))
    >>> maskfit.get_mask(dense).masks["kernel"].shape
    (2, 3)
    >>> maskfit.get_mask(dense).masks["kernel"].dtype
    dtype('bool')
    """

    def __init__(self, masks, scale="step"):
        self._scale = _check_scale(scale, "ElementMask")
        if not isinstance(masks, dict) or not masks:
            raise TypeError(
                "ElementMask takes a non-empty dict {variable_name: array}, e.g."
                f" ElementMask({{'kernel': np.ones((2, 3))}}). Received: {masks!r}"
            )
        checked = {}
        for name, values in masks.items():
            if not isinstance(name, str):
                raise TypeError(
                    "ElementMask keys must be variable names (str) such as 'kernel'."
                    f" Received key {name!r}"
                )
            checked[name] = _element_values(values, f"ElementMask['{name}']")
        self.masks = checked

    def _find(self, layer, name):
        return checks.find_variable(
            layer, name, layer.trainable_weights, "ElementMask", "trainable variables"
        )

    def resolve(self, layer):
        resolved = []
        for name, mask in self.masks.items():
            variable = self._find(layer, name)
            shape = tuple(variable.shape)
            try:
                fits = np.broadcast_shapes(mask.shape, shape) == shape
            except ValueError:
                fits = False
            if not fits:
                raise ValueError(
                    f"ElementMask['{name}'] for variable '{variable.path}' of layer"
                    f" '{layer.name}' has shape {mask.shape}, but the variable has shape"
                    f" {shape}. Pass an array of shape {shape} (or one that broadcasts"
                    " to it)."
                )
            resolved.append((variable, mask, "element"))
        return resolved

    def get_config(self):
        masks = {k: v.tolist() for k, v in self.masks.items()}
        return {"masks": masks, "scale": self.scale}

    def __repr__(self):
        shapes = {k: v.shape for k, v in self.masks.items()}
        scale = "" if self.scale == "step" else f", scale={self.scale!r}"
        return f"ElementMask(shapes={shapes}{scale})"


SCALES = ("step", "gradient")


def _check_scale(scale, what):
    if scale not in SCALES:
        raise ValueError(
            f"{what} scale must be 'step' (a value m is the learning rate x m: the"
            " entry moves m times as far, weight decay included) or 'gradient'"
            f" (m multiplies the gradient). Received: scale={scale!r}"
        )
    return scale


def as_grad_mask_spec(spec, where):
    """Returns `spec` if it is a mask spec (or None), else raises a TypeError."""
    if spec is None or isinstance(spec, GradMaskSpec):
        return spec
    raise TypeError(
        f"{where} expects a mask spec: maskfit.OutputMask, maskfit.ElementMask,"
        f" maskfit.PiecewiseMask (or None to remove the mask). Received: {spec!r} of type"
        f" {type(spec).__name__}"
    )
