"""Gradients taken by the backend that runs the computation, for maskfit's self-checks.

The checks of couplings (`maskfit.kinds.couplings.check`, keras_hub's blocks in
`maskfit.structured.hub.check`) ask which inputs or weights a layer's output
depends on. A `tf.GradientTape` sees no JAX operation: under
`KERAS_BACKEND=jax` it would give zeros for everything, and a check would pass
whatever it checks; under `KERAS_BACKEND=torch` likewise. `projected_gradients`
takes the gradients with `jax.grad` under JAX, with `torch.autograd.grad`
under torch and with a tape under TensorFlow, so a check sees the computation
it checks on every backend.
"""

import keras
import numpy as np

__all__ = ["projected_gradients"]


def projected_gradients(fn, inputs, rng):
    """Gradients of `sum(w * fn(*inputs))` with respect to each of `inputs`.

    `w` is drawn from `rng`, uniform in [0.5, 1.5] and of the output's shape, so
    no output entry's contribution cancels another's. An input the output does
    not depend on gets zeros; a NaN stays a NaN (never a silent pass).

    Args:
      fn: `(*tensors) -> tensor`, in Keras operations (or the backend's own);
        it is called on the backend's tensors.
      inputs: numpy arrays (or values that convert to them), one per argument.
      rng: a `numpy.random.Generator`.

    Returns:
      One numpy array per input: the gradient of the projected output.

    Example:

    >>> import keras, numpy as np
    >>> grads = projected_gradients(
    ...     lambda a, b: a * 2.0, [np.ones(3, "float32"), np.ones(2, "float32")],
    ...     np.random.default_rng(0))
    >>> bool(np.all(grads[0] >= 1.0)), bool(np.all(grads[1] == 0))
    (True, True)
    """
    inputs = [np.asarray(value) for value in inputs]
    if keras.backend.backend() == "jax":
        return _jax(fn, inputs, rng)
    if keras.backend.backend() == "torch":
        return _torch(fn, inputs, rng)
    return _tensorflow(fn, inputs, rng)


def _jax(fn, inputs, rng):
    import jax
    import jax.numpy as jnp

    values = [jnp.asarray(value) for value in inputs]
    shape = jax.eval_shape(fn, *values)
    weights = jnp.asarray(rng.uniform(0.5, 1.5, size=shape.shape), shape.dtype)

    def total(*values):
        return jnp.sum(fn(*values) * weights)

    gradients = jax.grad(total, argnums=tuple(range(len(values))))(*values)
    return [np.asarray(gradient) for gradient in gradients]


def _torch(fn, inputs, rng):
    import torch

    values = []
    for value in inputs:
        tensor = keras.ops.convert_to_tensor(value, dtype=value.dtype.name)
        if tensor.is_floating_point():
            tensor = tensor.detach().requires_grad_(True)
        values.append(tensor)
    with torch.enable_grad():
        output = keras.ops.convert_to_tensor(fn(*values))
        weights = rng.uniform(0.5, 1.5, size=tuple(output.shape))
        weights = torch.as_tensor(weights, dtype=output.dtype, device=output.device)
        total = torch.sum(output * weights)
    learns = [v for v in values if v.requires_grad]
    found = [None] * len(learns)
    if learns and total.requires_grad:
        found = torch.autograd.grad(total, learns, allow_unused=True)
    found = iter(found)
    gradients = []
    for value in values:
        gradient = next(found) if value.requires_grad else None
        gradient = torch.zeros_like(value) if gradient is None else gradient
        gradients.append(gradient.detach().cpu().numpy())
    return gradients


def _tensorflow(fn, inputs, rng):
    import tensorflow as tf

    values = [tf.constant(value) for value in inputs]
    with tf.GradientTape() as tape:
        tape.watch(values)
        output = tf.convert_to_tensor(fn(*values))
        weights = tf.constant(rng.uniform(0.5, 1.5, size=output.shape), output.dtype)
        total = tf.reduce_sum(output * weights)
    gradients = tape.gradient(
        total, values, unconnected_gradients=tf.UnconnectedGradients.ZERO
    )
    # A gather's gradient is `IndexedSlices` (a relative position table's):
    # made dense, the array of the input's shape.
    return [np.asarray(tf.convert_to_tensor(gradient)) for gradient in gradients]
