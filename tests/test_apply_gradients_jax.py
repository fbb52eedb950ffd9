"""`maskfit.apply_gradients` and the stateless `maskfit.stateless_apply` under JAX."""

import jax
import keras
import numpy as np
import pytest

import maskfit

pytestmark = pytest.mark.backends("jax")


def _model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, activation="tanh", name="hidden")
    head = maskfit.set_mask(
        keras.layers.Dense(2, name="head"), maskfit.OutputMask([1, 0])
    )
    return keras.Model(inputs, head(hidden(inputs))), hidden, head


def test_apply_gradients_keeps_masked_entries_under_adamw_and_ema():
    model, hidden, head = _model()
    optimizer = keras.optimizers.AdamW(
        0.1, weight_decay=0.5, use_ema=True, ema_overwrite_frequency=2
    )
    optimizer.build(model.trainable_variables)
    kernel0, hidden0 = np.array(head.kernel), np.array(hidden.kernel)
    for _ in range(4):
        maskfit.apply_gradients(
            optimizer, {head.kernel.path: np.ones((4, 2)), head.bias.path: [1.0, 1.0]}
        )
    np.testing.assert_array_equal(np.array(head.kernel)[:, 1], kernel0[:, 1])
    assert np.all(np.array(head.kernel)[:, 0] != kernel0[:, 0])
    # Left out of the dict: no weight decay, no EMA overwrite.
    np.testing.assert_array_equal(np.array(hidden.kernel), hidden0)
    assert int(optimizer.iterations) == 4


def test_apply_gradients_names_a_wrong_shape_and_an_unknown_path():
    model, _, head = _model()
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    with pytest.raises(ValueError, match=r"'head/kernel' has shape \(2, 4\).*\(4, 2\)"):
        maskfit.apply_gradients(optimizer, {head.kernel.path: np.ones((2, 4))})
    with pytest.raises(ValueError, match=r"'nope'.*Known paths"):
        maskfit.apply_gradients(optimizer, {"nope": np.ones((4, 2))})
    with pytest.raises(ValueError, match="3 gradients for 4 variables"):
        maskfit.apply_gradients(optimizer, [np.ones((3, 4))] * 3)
    assert int(optimizer.iterations) == 0


def _position(model, variable):
    return [id(v) for v in model.trainable_variables].index(id(variable))


def _stateless_loop(model, optimizer, steps, masks_at, traces):
    """A stateless JAX loop: `jax.jit` over values, the masks an argument."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    optimizer_values = [v.value for v in optimizer.variables]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype("float32")
    y = rng.normal(size=(8, 2)).astype("float32")

    def loss(trainable, x, y):
        y_pred, _ = model.stateless_call(trainable, non_trainable, x)
        return keras.ops.mean((y_pred - y) ** 2)

    @jax.jit
    def step(trainable, optimizer_values, masks, x, y):
        traces.append(1)
        grads = jax.grad(loss)(trainable, x, y)
        return maskfit.stateless_apply(
            optimizer, masks, optimizer_values, grads, trainable
        )

    history = []
    for i in range(steps):
        trainable, optimizer_values = step(
            trainable, optimizer_values, masks_at(i), x, y
        )
        history.append([np.array(t) for t in trainable])
    return history, optimizer_values


def test_stateless_apply_in_a_jitted_loop_holds_masks_and_takes_new_ones():
    model, _, head = _model()
    optimizer = keras.optimizers.Adam(0.1, weight_decay=0.2)
    optimizer.build(model.trainable_variables)
    first = maskfit.stateless_masks(model)
    maskfit.set_mask(head, maskfit.OutputMask([0, 1]))
    second = maskfit.stateless_masks(model)
    kernel = _position(model, head.kernel)
    start = np.array(head.kernel)
    traces = []
    history, _ = _stateless_loop(
        model, optimizer, 6, lambda i: first if i < 3 else second, traces
    )
    for i in range(3):
        np.testing.assert_array_equal(history[i][kernel][:, 1], start[:, 1])
    for i in range(3, 6):
        np.testing.assert_array_equal(
            history[i][kernel][:, 0], history[2][kernel][:, 0]
        )
    assert np.all(history[5][kernel][:, 1] != history[2][kernel][:, 1])
    assert len(traces) == 1  # new values of the same structure: no retrace


def test_piecewise_mask_switches_at_the_exact_step_inside_the_jitted_function():
    model, _, head = _model()
    maskfit.set_mask(
        head,
        maskfit.PiecewiseMask(
            [2, 4], [maskfit.OutputMask(m) for m in ([0, 0], [1, 0], [1, 1])]
        ),
    )
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    masks = maskfit.stateless_masks(model)
    kernel = _position(model, head.kernel)
    start = np.array(head.kernel)
    traces = []
    history, _ = _stateless_loop(model, optimizer, 6, lambda i: masks, traces)
    np.testing.assert_array_equal(history[1][kernel], start)  # steps 0, 1
    assert np.all(history[2][kernel][:, 0] != start[:, 0])  # step 2: unit 0
    np.testing.assert_array_equal(history[3][kernel][:, 1], start[:, 1])
    assert np.all(history[4][kernel][:, 1] != start[:, 1])  # step 4: unit 1
    assert len(traces) == 1
