"""Declaring gradient masks on layers: `set_mask`, `get_mask` and the backprop gate."""

import functools
import itertools
import weakref

import keras
import tensorflow as tf

from maskfit import probe
from maskfit import internals
from maskfit import specs
from maskfit import units

__all__ = [
    "set_mask",
    "get_mask",
    "masked_layers",
    "all_masked_layers",
    "mask_version",
]

_SPEC_ATTR = "_maskfit_grad_mask"
_ORIGINAL_CALL_ATTR = "_maskfit_original_call"
_GATE_ATTR = "_maskfit_gate_values"
_versions = itertools.count(1)
_current_version = [0]
_masked = weakref.WeakSet()


def mask_version():
    """Returns a number that changes each time any mask is set or removed."""
    return _current_version[0]


def set_mask(layer, spec):
    """Declares which of `layer`'s parameters may learn, and returns `layer`.

    The spec is stored on the layer object, so it holds whether the layer sits
    in a functional, Sequential or subclassed model, or inside a nested model.
    `MaskedModel` (and `maskfit.apply_gradients`) read it when they build their
    training step. A layer that is not built yet is checked again at build time.

    Args:
      layer: a `keras.layers.Layer`.
      spec: a `maskfit.OutputMask` or `maskfit.ElementMask`, or None to remove
        the layer's mask.

    Returns:
      `layer`, so that `y = set_mask(keras.layers.Dense(2), spec)(x)` chains.

    Raises:
      TypeError: if `layer` is not a Keras layer or `spec` is not a mask spec.
      ValueError: if the spec does not fit the layer (see the spec classes).

    Example:

    >>> import keras, maskfit
    >>> dense = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> maskfit.get_mask(dense)
    OutputMask([1.0, 0.0], backprop=False)
    >>> _ = maskfit.set_mask(dense, None)
    >>> maskfit.get_mask(dense) is None
    True
    """
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(
            "set_mask expects a keras.layers.Layer as its first argument."
            f" Received: {layer!r} of type {type(layer).__name__}"
        )
    spec = specs.as_grad_mask_spec(spec, f"set_mask on layer '{layer.name}'")
    if spec is not None:
        spec.check_layer(layer)
    object.__setattr__(layer, _SPEC_ATTR, spec)
    _masked.add(layer)
    if getattr(spec, "backprop", False):
        _install_backprop_gate(layer)
    _current_version[0] = next(_versions)
    return layer


def get_mask(layer):
    """Returns the mask spec declared on `layer`, or None when it has none.

    Example:

    >>> import keras, maskfit
    >>> maskfit.get_mask(keras.layers.Dense(2)) is None
    True
    """
    return getattr(layer, _SPEC_ATTR, None)


def masked_layers(model):
    """Returns `[(layer, spec)]` for `model` and every layer nested in it.

    Raises:
      ValueError: when a masked layer sits inside a
        `keras.layers.SpectralNormalization`, which rewrites its kernel in
        `call()`, outside the optimizer, so no mask could hold.
    """
    layers = [model] + internals.sublayers(model)
    for layer in layers:
        if isinstance(layer, keras.layers.SpectralNormalization):
            inner = [layer.layer] + internals.sublayers(layer.layer)
            masked = [x.name for x in inner if get_mask(x) is not None]
            if masked:
                raise ValueError(
                    f"Layer '{masked[0]}' carries a gradient mask but is wrapped by"
                    f" SpectralNormalization '{layer.name}', which rewrites its"
                    " kernel inside call() on every training step, outside the"
                    " optimizer, so frozen entries would move. Remove the mask, or"
                    " the SpectralNormalization wrapper."
                )
    return [(layer, get_mask(layer)) for layer in layers if get_mask(layer)]


def all_masked_layers():
    """Returns `[(layer, spec)]` for every live layer that carries a mask."""
    return [(layer, get_mask(layer)) for layer in list(_masked) if get_mask(layer)]


@tf.custom_gradient
def _gate(outputs, values):
    """Identity forward; the gradient is scaled by `values` (which broadcast
    along the output's unit axis), and 0 where 0."""

    def grad(upstream):
        values_ = tf.cast(values, upstream.dtype)
        gated = tf.where(values_ > 0, upstream * values_, tf.zeros_like(upstream))
        return gated, None

    return tf.identity(outputs), grad


def set_gate_values(layer, values):
    """Makes `layer`'s backprop gate read `values` (e.g. a mask variable)."""
    object.__setattr__(layer, _GATE_ATTR, values)


def _gate_outputs(layer, outputs):
    spec = get_mask(layer)
    if not getattr(spec, "backprop", False) or probe.is_probing():
        return outputs
    flat = tf.nest.flatten(outputs)
    if not any(isinstance(y, tf.Tensor) for y in flat):
        return outputs  # a symbolic (functional) call
    segments = units.output_segments(layer)
    values = getattr(layer, _GATE_ATTR, None)
    values = tf.convert_to_tensor(spec.values if values is None else values)
    gated = []
    for i, y in enumerate(flat):
        segment = segments[i] if i < len(segments) else None
        if segment is None or not isinstance(y, tf.Tensor):
            gated.append(y)
            continue
        gated.append(_gate(y, _gate_values(layer, y, segment, values, spec.units)))
    return tf.nest.pack_sequence_as(outputs, gated)


def _gate_values(layer, output, segment, values, units_count):
    """The slice of `values` that `output` carries, shaped along its unit axis."""
    axis, start, stop = segment
    rank = output.shape.rank
    if rank is None or not -rank <= axis < rank:
        raise ValueError(
            f"OutputMask(backprop=True) on layer '{layer.name}' gates the output's"
            f" unit axis {axis}, but the output has shape {output.shape}. Use"
            " backprop=False, or declare the layer's output_axis."
        )
    size = output.shape[axis]
    end = stop if stop is not None else (None if size is None else start + size)
    if size is not None and (end - start != size or end > units_count):
        raise ValueError(
            f"OutputMask(backprop=True) on layer '{layer.name}' has"
            f" {units_count} values, but the layer's output has {size} entries"
            f" along its unit axis {axis} (units {start}..{end - 1} expected)."
            " Pass one value per output unit."
        )
    if end is None:
        end = start + tf.shape(output)[axis]
    shape = [1] * rank
    shape[axis] = -1
    return tf.reshape(values[start:end], shape)


def _install_backprop_gate(layer):
    """Wraps `layer.call` once so that its outputs pass through the gate."""
    if getattr(layer, _ORIGINAL_CALL_ATTR, None) is not None:
        return
    original = layer.call

    @functools.wraps(original)
    def call(*args, **kwargs):
        return _gate_outputs(layer, original(*args, **kwargs))

    object.__setattr__(layer, _ORIGINAL_CALL_ATTR, original)
    object.__setattr__(layer, "call", call)
