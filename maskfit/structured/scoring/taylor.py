"""The Taylor sums of a one-shot selection: `|w * g|` over a few batches.

`select_units(..., importance="taylor")` takes the gradients of `loss` on
`data`, batch by batch, as training takes them (`training=True`, the
model's own losses added), with the backend Keras runs on: a
`tf.GradientTape` on TensorFlow, `jax.grad` of `model.stateless_call` on
JAX (which leaves the model's state as it was).
"""

import keras
import numpy as np
import tensorflow as tf

__all__ = ["one_shot_sums"]


def one_shot_sums(model, variables, importance, data, loss, batch_size):
    """`{id(variable): tf.Variable}`: `importance.accumulate` summed over the batches.

    Raises:
      ValueError: without `data` or `loss`.
    """
    if data is None or loss is None:
        raise ValueError(
            "select_units with TaylorImportance needs data=(x, y) and a loss to"
            " take gradients on. Received: data is None or loss is None."
        )
    x, y = data
    loss_fn = keras.losses.get(loss)
    sums = {id(v): tf.Variable(tf.zeros(tuple(v.shape))) for v in variables}
    count = len(keras.tree.flatten(x)[0])
    gradients_of = _jax_gradients if keras.backend.backend() == "jax" else _tf_gradients
    # Gradients as training takes them (training=True: batch statistics),
    # with the model's state (moving averages) put back after.
    state = [(v, v.numpy()) for v in model.non_trainable_variables]
    try:
        for start in range(0, count, batch_size):
            batch_x, batch_y = keras.tree.map_structure(
                lambda a, start=start: a[start : start + batch_size], (x, y)
            )
            gradients = gradients_of(model, variables, loss_fn, batch_x, batch_y)
            for variable, gradient in zip(variables, gradients):
                if gradient is not None:
                    added = importance.accumulate(variable.value, gradient)
                    sums[id(variable)].assign_add(np.asarray(added, "float32"))
    finally:
        for variable, value in state:
            variable.assign(value)
    return sums


def _tf_gradients(model, variables, loss_fn, x, y):
    with tf.GradientTape() as tape:
        value = loss_fn(y, model(x, training=True))
        value += sum(model.losses)  # regularizers, as fit adds them
    return tape.gradient(value, variables)


def _jax_gradients(model, variables, loss_fn, x, y):
    import jax  # only under KERAS_BACKEND=jax

    trainable = model.trainable_variables
    non_trainable = [v.value for v in model.non_trainable_variables]

    def value_of(values):
        y_pred, _, losses = model.stateless_call(
            values, non_trainable, x, training=True, return_losses=True
        )
        value = loss_fn(y, y_pred) + sum(losses)  # regularizers, as fit adds them
        # Summed, as `tf.GradientTape.gradient` sums a loss per sample.
        return keras.ops.sum(value)

    gradients = jax.grad(value_of)([v.value for v in trainable])
    position = {id(v): i for i, v in enumerate(trainable)}
    return [
        gradients[position[id(v)]] if id(v) in position else None for v in variables
    ]
