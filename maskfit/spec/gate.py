"""The `backprop=True` gate: a layer's outputs pass their gradient through its mask.

`OutputMask(values, backprop=True)` also blocks (where 0; with
`scale="gradient"`, scales by the value) the gradient that flows from a
layer's output units into the layers upstream, along the output's unit axis. `install` wraps the layer's `call` once; the gate reads
the mask in force (the step's mask state, once planned: `set_values`), so a
schedule switches it with the mask. The forward value is unchanged.

On TensorFlow the gate is a `tf.custom_gradient`; on JAX a `jax.custom_vjp`
(the same rule), and the JAX step gives each gate the mask in force at its
optimizer step, selected inside the compiled step (`using`).
"""

import contextlib
import functools

import keras
import tensorflow as tf

from maskfit import internals
from maskfit.units import layout, probe

__all__ = ["install", "set_values", "using"]

_ORIGINAL_CALL_ATTR = "_maskfit_original_call"
_VALUES_ATTR = "_maskfit_gate_values"


@tf.custom_gradient
def _gate(outputs, values):
    """Identity forward; the gradient is scaled by `values` (which broadcast
    along the output's unit axis), and 0 where 0."""

    def grad(upstream):
        values_ = tf.cast(values, upstream.dtype)
        gated = tf.where(values_ > 0, upstream * values_, tf.zeros_like(upstream))
        return gated, None

    return tf.identity(outputs), grad


_jax_gate = []  # the jax.custom_vjp gate, made on first use under JAX


def _gate_jax(outputs, values):
    """`_gate` on JAX: identity forward, the same gradient rule."""
    if not _jax_gate:
        import jax  # only under KERAS_BACKEND=jax
        import jax.numpy as jnp

        @jax.custom_vjp
        def gate(outputs, values):
            return outputs

        def forward(outputs, values):
            return outputs, values

        def backward(values, upstream):
            gated = jnp.where(values > 0, upstream * values, jnp.zeros_like(upstream))
            return gated, jnp.zeros_like(values)

        gate.defvjp(forward, backward)
        _jax_gate.append(gate)
    return _jax_gate[0](outputs, keras.ops.cast(values, outputs.dtype))


def set_values(layer, values):
    """Makes `layer`'s gate read `values` (e.g. the step's mask variable)."""
    internals.set_untracked(layer, _VALUES_ATTR, values)


@contextlib.contextmanager
def using(layer_values):
    """While active, each `(layer, values)`'s gate reads `values`.

    The JAX step's way in: `values` are the mask in force at the step,
    selected inside the compiled step; outside it each gate reads its
    layer's spec again (or what `set_values` gave it).
    """
    previous = [
        (layer, getattr(layer, _VALUES_ATTR, None)) for layer, _ in layer_values
    ]
    for layer, values in layer_values:
        set_values(layer, values)
    try:
        yield
    finally:
        for layer, values in previous:
            set_values(layer, values)


def install(layer, spec_of):
    """Wraps `layer.call` once so that its outputs pass through the gate.

    Args:
      layer: the layer whose outputs are gated.
      spec_of: `layer -> spec`, how the gate finds the layer's mask spec at
        call time (`maskfit.get_mask`); no gate applies while it has none
        with `backprop=True`.
    """
    if getattr(layer, _ORIGINAL_CALL_ATTR, None) is not None:
        return
    original = layer.call

    @functools.wraps(original)
    def call(*args, **kwargs):
        return _gate_outputs(layer, spec_of(layer), original(*args, **kwargs))

    internals.set_untracked(layer, _ORIGINAL_CALL_ATTR, original)
    internals.set_untracked(layer, "call", call)


def _gate_outputs(layer, spec, outputs):
    if not getattr(spec, "backprop", False) or probe.is_probing():
        return outputs
    flat = tf.nest.flatten(outputs)
    on_jax = keras.backend.backend() == "jax"
    if on_jax:
        import jax  # only under KERAS_BACKEND=jax

        is_value = functools.partial(_is_instance, kinds=jax.Array)
        gate = _gate_jax
    else:
        is_value = functools.partial(_is_instance, kinds=tf.Tensor)
        gate = _gate
    if not any(is_value(y) for y in flat):
        return outputs  # a symbolic (functional) call
    segments = layout.output_segments(layer)
    values = getattr(layer, _VALUES_ATTR, None)
    values = keras.ops.convert_to_tensor(spec.values if values is None else values)
    if spec.scale == "step":
        # Other values scale the unit's learning rate, not what flows upstream.
        values = keras.ops.cast(keras.ops.not_equal(values, 0), values.dtype)
    gated = []
    for i, y in enumerate(flat):
        segment = segments[i] if i < len(segments) else None
        if segment is None or not is_value(y):
            gated.append(y)
            continue
        gated.append(gate(y, _values_along(layer, y, segment, values, spec.units)))
    return tf.nest.pack_sequence_as(outputs, gated)


def _is_instance(value, kinds):
    return isinstance(value, kinds)


def _values_along(layer, output, segment, values, units_count):
    """The slice of `values` that `output` carries, shaped along its unit axis."""
    axis, start, stop = segment
    rank = getattr(output.shape, "rank", None)
    if rank is None and not isinstance(output.shape, tf.TensorShape):
        rank = len(output.shape)  # a JAX array's shape, a tuple
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
    return keras.ops.reshape(values[start:end], shape)
