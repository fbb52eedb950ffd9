"""`ActivationImportance`: unit scores from activations seen on calibration batches.

Minitron (arXiv 2407.14679) ranks FFN units and heads by the norm of their
outputs over a small calibration set; Wanda (arXiv 2306.11695) scores a
weight by `|w|` times the norm of the input it multiplies. Both need what a
layer reads, which weights alone do not show: `calibrate` runs the model on
calibration batches with every layer that owns variables watched, and keeps,
per variable, the L2 norm of the layer's input over the batches along the
variable's input axes. A unit's score is then summed over its group as for
every importance: the input slices of the layers that read the unit carry
the norm of the unit's own output (a head's, an FFN unit's).
"""

import keras
import numpy as np
import tensorflow as tf

from maskfit import internals
from maskfit.structured.scoring import importance as importance_lib

__all__ = ["ActivationImportance"]


def _input_axes(variable_shape, input_shape, convolution=None):
    """Where the layer's input channels lie in a variable: `(axes, input axes)` or None.

    A convolution's kernel (`convolution` is `"kernel"` or, transposed,
    `"transposed"`; channels last) has them at axis -2 (-1 transposed);
    other variables at their leading axes that match the input's trailing
    ones (Dense and EinsumDense kernels, normalization scales).
    """
    rank = len(variable_shape)
    if convolution is not None:
        axis = rank - 1 if convolution == "transposed" else rank - 2
        if rank >= 3 and variable_shape[axis] == input_shape[-1]:
            return (axis,), (len(input_shape) - 1,)
        return None
    for k in range(min(rank, len(input_shape) - 1), 0, -1):
        if tuple(variable_shape[:k]) == tuple(input_shape[-k:]):
            return tuple(range(k)), tuple(range(len(input_shape) - k, len(input_shape)))
    return None


def _convolution(layer, variable):
    """`"kernel"`/`"transposed"` for a channels-last convolution's kernels, else None.

    A channels-first convolution's kernels are refused with `"channels_first"`.
    """
    config = layer.get_config()
    if "kernel_size" not in config or len(variable.shape) < 3:
        return None
    if config.get("data_format") == "channels_first":
        return "channels_first"
    return "transposed" if "Transpose" in type(layer).__name__ else "kernel"


def _first_tensor(args, kwargs):
    for value in list(args) + list(kwargs.values()):
        if hasattr(value, "dtype") and hasattr(value, "shape"):
            return value
    return None


def _own_variables(layer):
    inner = {id(w) for sub in internals.sublayers(layer) for w in sub.weights}
    return [w for w in layer.weights if id(w) not in inner]


@keras.saving.register_keras_serializable(package="maskfit")
class ActivationImportance(importance_lib.Importance):
    """Scores from the activations of calibration batches (Wanda, Minitron).

    `calibrate(model, x)` runs `model` on `x` (inference mode, in batches)
    and records, for every variable of every layer (nested ones too: the
    projections inside a transformer block), the L2 norm over all batches
    and positions of the layer's input along the variable's input axes (a
    Dense kernel's rows, an EinsumDense kernel's leading axes, a
    convolution kernel's input channels, channels last). An entry's score
    is `|w| * norm` (`weighted=True`, Wanda), or `norm` shared over the
    entries it multiplies (`weighted=False`: a unit's score is then the
    norm of its output, read at the layers that consume it, as Minitron
    ranks heads and FFN units). Variables whose input axis cannot be told
    (embeddings, channels-first convolutions) score 0, so a unit's score
    comes from the layers that read it. Works with any model that
    `prune_units` and `select_units` take; the norms are fixed at
    calibration (calibrate again to rank on later activations).

    Args:
      weighted: multiply the norms by `|w|` (Wanda) or not (output norms).
      norms: `{variable path: nested list}`, what `calibrate` recorded (for
        `from_config`; leave None and call `calibrate`).

    Example:

    >>> import keras, numpy as np, maskfit.pruning as pruning
    >>> inputs = keras.Input((3,))
    >>> hidden = keras.layers.Dense(4, name="hidden")
    >>> model = keras.Model(inputs, keras.layers.Dense(1)(hidden(inputs)))
    >>> _ = hidden.kernel.assign(np.eye(3, 4, dtype="float32"))  # unit 3 reads nothing
    >>> _ = hidden.bias.assign([0.0, 0.0, 5.0, 0.0])               # unit 2: constant 5
    >>> x = np.random.default_rng(0).normal(size=(64, 3)) * [1.0, 2.0, 3.0]
    >>> importance = pruning.ActivationImportance(weighted=False).calibrate(
    ...     model, x.astype("float32"))
    >>> pruning.select_units(model, 0.5, importance=importance).removed()
    {'hidden': {'units': [0, 3]}}
    """

    def __init__(self, weighted=True, norms=None):
        if not isinstance(weighted, bool):
            raise TypeError(
                f"ActivationImportance weighted must be True or False. Received: {weighted!r}"
            )
        if norms is not None and not isinstance(norms, dict):
            raise TypeError(
                "ActivationImportance norms must be a dict {variable path: norms}"
                f" (what calibrate records), or None. Received: {type(norms).__name__}"
            )
        self.weighted = weighted
        self.norms = {k: np.asarray(v, np.float32) for k, v in (norms or {}).items()}

    def calibrate(self, model, x, batch_size=32):
        """Records the input norms of every layer of `model` on `x`; returns self.

        Args:
          model: a Keras model (any kind: the layers it calls are watched).
          x: the inputs, an array or a structure of arrays as `model` takes
            them (a keras_hub backbone's dict of token ids and padding mask).
          batch_size: examples per call.

        Raises:
          ValueError: if `x` is empty, or no layer of `model` read a float
            input with a variable whose input axis could be told.
        """
        leaves = keras.tree.flatten(x)
        count = len(leaves[0]) if leaves else 0
        if count == 0 or isinstance(batch_size, bool) or int(batch_size) < 1:
            raise ValueError(
                f"ActivationImportance.calibrate needs at least one example in x and"
                f" batch_size >= 1. Received: {count} examples, batch_size={batch_size!r}"
            )
        sums, undo = {}, []
        try:
            for layer in [model] + internals.sublayers(model):
                own = _own_variables(layer)
                if own:
                    undo.append(
                        internals.set_method(layer, "call", _watch(layer, own, sums))
                    )
            for start in range(0, count, int(batch_size)):
                batch = keras.tree.map_structure(
                    lambda a, start=start: a[start : start + int(batch_size)], x
                )
                model(batch, training=False)
        finally:
            for step in reversed(undo):
                step()
        if not sums:
            raise ValueError(
                f"ActivationImportance.calibrate saw no input of a layer of model"
                f" '{model.name}' whose variables it could match (a float input whose"
                " trailing axes are a kernel's leading ones, or a channels-last"
                " convolution's channels). Nothing to score with."
            )
        self.norms = {
            path: np.sqrt(total).astype(np.float32) for path, total in sums.items()
        }
        return self

    def __call__(self, variable, value, accumulated):
        if not self.norms:
            raise ValueError(
                "ActivationImportance has no norms yet: call"
                " importance.calibrate(model, x) with calibration inputs before"
                " pruning with it."
            )
        norm = self.norms.get(variable.path)
        if norm is None:
            return tf.zeros_like(value)
        if not _broadcasts(norm.shape, tuple(value.shape)):
            raise ValueError(
                f"ActivationImportance: variable '{variable.path}' has shape"
                f" {tuple(value.shape)}, but its recorded norms have shape"
                f" {norm.shape}: they were recorded for another model. Calibrate"
                " on the model you prune."
            )
        norm = tf.constant(norm, value.dtype)
        if self.weighted:
            return tf.abs(value) * norm
        share = int(np.prod(value.shape)) // int(np.prod(norm.shape))
        return tf.broadcast_to(norm / share, tuple(value.shape))

    def get_config(self):
        return {
            "weighted": self.weighted,
            "norms": {k: v.tolist() for k, v in sorted(self.norms.items())},
        }

    def __repr__(self):
        return (
            f"ActivationImportance(weighted={self.weighted!r},"
            f" norms=<{len(self.norms)} variables>)"
        )


def _broadcasts(shape, target):
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _watch(layer, variables, sums):
    """A `call` for `layer` that adds the squares of its input to `sums` first."""
    call = type(layer).call.__get__(layer)
    if "call" in vars(layer):
        call = vars(layer)["call"]

    kinds = {id(v): _convolution(layer, v) for v in variables}

    def watched(*args, **kwargs):
        tensor = _first_tensor(args, kwargs)
        if tensor is not None and tf.as_dtype(tensor.dtype).is_floating:
            squares = np.square(np.asarray(tensor, np.float64))
            for variable in variables:
                kind = kinds[id(variable)]
                if kind == "channels_first":
                    continue
                found = _input_axes(tuple(variable.shape), squares.shape, kind)
                if found is None:
                    continue
                axes, input_axes = found
                other = tuple(a for a in range(squares.ndim) if a not in input_axes)
                total = squares.sum(axis=other)
                shape = [1] * len(variable.shape)
                for axis, size in zip(axes, total.shape):
                    shape[axis] = size
                total = total.reshape(shape)
                key = variable.path
                sums[key] = sums.get(key, 0.0) + total
        return call(*args, **kwargs)

    return watched
