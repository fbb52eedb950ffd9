"""Tests of maskfit.apply.apply_gradients: input forms, checks, exact freezing."""

import jax
import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit.apply import apply_gradients

pytestmark = pytest.mark.backends("tensorflow", "jax", "torch")
BACKEND = keras.backend.backend()


def _model(mask=None, activation="relu"):
    """Input(3) -> Dense(4) -> Dense(2) head, optionally masked; returns both."""
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, activation=activation)
    head = keras.layers.Dense(2)
    if mask is not None:
        maskfit.set_mask(head, mask)
    model = keras.Model(inputs, head(hidden(inputs)))
    return model, hidden, head


def _built(optimizer, model):
    optimizer.build(model.trainable_variables)
    return optimizer


def _ones(model, scale=1.0):
    return [np.full(v.shape, scale, np.float32) for v in model.trainable_variables]


def _values(model):
    return [v.numpy().copy() for v in model.trainable_variables]


def _assert_sgd_step(before, model, grads):
    for b, v, g in zip(before, model.trainable_variables, grads):
        expected = b if g is None else b - np.asarray(g, np.float32)
        np.testing.assert_allclose(v.numpy(), expected, rtol=1e-6)


class TestInputForms:
    def test_list_aligned_with_built_variables(self):
        model, _, _ = _model()
        optimizer = _built(keras.optimizers.SGD(1.0), model)
        before, grads = _values(model), _ones(model, 0.5)
        apply_gradients(optimizer, grads)
        _assert_sgd_step(before, model, grads)

    def test_pairs(self):
        model, _, head = _model()
        optimizer = _built(keras.optimizers.SGD(1.0), model)
        before = _values(model)
        apply_gradients(optimizer, zip([np.ones((2,), np.float32)], [head.bias]))
        _assert_sgd_step(before, model, [None, None, None, np.ones(2)])

    @pytest.mark.backends("tensorflow")  # variable.value.ref(): a tf.Variable's
    def test_dict_by_path_and_by_ref(self):
        model, hidden, head = _model()
        optimizer = _built(keras.optimizers.SGD(1.0), model)
        before = _values(model)
        grads = {head.kernel.path: np.ones((4, 2)), hidden.bias.value.ref(): [2.0] * 4}
        apply_gradients(optimizer, grads)
        _assert_sgd_step(before, model, [None, [2.0] * 4, np.ones((4, 2)), None])

    def test_variables_argument_builds_the_optimizer(self):
        model, _, _ = _model()
        optimizer = keras.optimizers.SGD(1.0)
        before, grads = _values(model), _ones(model)
        apply_gradients(optimizer, grads, variables=model.trainable_variables)
        _assert_sgd_step(before, model, grads)
        assert optimizer.built

    def test_integer_and_float64_gradients_are_cast(self):
        model, _, _ = _model()
        optimizer = _built(keras.optimizers.SGD(1.0), model)
        before = _values(model)
        grads = [np.ones(v.shape, np.float64) for v in model.trainable_variables]
        grads[3] = [1, 2]
        apply_gradients(optimizer, grads)
        _assert_sgd_step(before, model, grads)

    @pytest.mark.backends("tensorflow")
    def test_inside_tf_function_first_call_and_after(self):
        model, _, head = _model(maskfit.OutputMask([1, 0]))
        optimizer = _built(keras.optimizers.AdamW(0.1, weight_decay=0.5), model)
        frozen = head.kernel.numpy()[:, 1].copy()

        @tf.function
        def step(scale):
            apply_gradients(optimizer, [g * scale for g in _ones(model)])

        for i in range(3):
            step(tf.constant(float(i + 1)))
        apply_gradients(optimizer, _ones(model))
        np.testing.assert_array_equal(head.kernel.numpy()[:, 1], frozen)
        assert not np.array_equal(head.kernel.numpy()[:, 0], frozen)
        assert int(optimizer.iterations.numpy()) == 4


def _bad_calls(model, hidden, head):
    good = _ones(model)
    # JAX's apply_gradients checks in its own words (a `{backend: match}`).
    calls = {
        "count": (
            good[:3],
            ValueError,
            {
                "tensorflow": r"3 gradients for 4 variables.*\(4, 2\)",
                "jax": r"3 gradients for 4 variables.*in this order",
                "torch": r"3 gradients for 4 variables.*in this order",
            },
        ),
        "unknown_path": (
            {"dense_kernal": 1.0},
            ValueError,
            {
                "tensorflow": "unknown variable path",
                "jax": r"path 'dense_kernal', which names 0.*Known paths",
                "torch": r"path 'dense_kernal', which names 0.*Known paths",
            },
        ),
        "close_path": ({head.kernel.path + "x": good[2]}, ValueError, "Did you mean"),
        "summable_shape": (
            good[:3] + [np.ones((5, 2))],
            ValueError,
            r"\(5, 2\).*axes \[0\]",
        ),
        "shape": (
            good[:3] + [np.ones((3,))],
            ValueError,
            {
                "tensorflow": r"Gradient 3 .*shape \(3,\)",
                "jax": r"has shape \(3,\), but the variable has shape \(2,\)",
                "torch": r"has shape \(3,\), but the variable has shape \(2,\)",
            },
        ),
        "complex": (good[:3] + [np.ones((2,), np.complex64)], TypeError, "complex64"),
        "string": (good[:3] + [np.array(["a", "b"])], TypeError, "cannot be cast"),
        "single_tensor": (np.ones(2), TypeError, "single tensor"),
        "all_none": ([None] * 4, ValueError, "no gradient"),
    }
    if BACKEND == "tensorflow":  # a dict keyed by variable.value.ref()
        calls["duplicate"] = (
            {head.bias.path: good[3], head.bias.value.ref(): good[3]},
            ValueError,
            "two gradients",
        )
    return calls


_TENSORFLOW = pytest.mark.backends("tensorflow")
# TensorFlow's checks alone: a close path suggested, the axes to sum named,
# complex and string gradients refused, a ref() key.
_BAD_CALLS = [
    "count",
    "unknown_path",
    pytest.param("close_path", marks=_TENSORFLOW),
    pytest.param("summable_shape", marks=_TENSORFLOW),
    "shape",
    pytest.param("complex", marks=_TENSORFLOW),
    pytest.param("string", marks=_TENSORFLOW),
    "single_tensor",
    "all_none",
    pytest.param("duplicate", marks=_TENSORFLOW),
]


@pytest.mark.parametrize("case", _BAD_CALLS)
def test_rejected_call_changes_nothing(case):
    model, hidden, head = _model(maskfit.OutputMask([1, 0]))
    optimizer = _built(keras.optimizers.AdamW(0.1, weight_decay=0.5), model)
    apply_gradients(optimizer, _ones(model))
    before, iterations = _values(model), int(optimizer.iterations.numpy())
    grads, error, match = _bad_calls(model, hidden, head)[case]
    if isinstance(match, dict):
        match = match[BACKEND]
    with pytest.raises(error, match=match):
        apply_gradients(optimizer, grads)
    for b, v in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(v.numpy(), b)
    assert int(optimizer.iterations.numpy()) == iterations


def test_unbuilt_optimizer_and_foreign_variable_are_rejected():
    model, _, _ = _model()
    other, _, _ = _model()
    with pytest.raises(ValueError, match="not built"):
        apply_gradients(keras.optimizers.Adam(), _ones(model))
    optimizer = _built(keras.optimizers.Adam(), model)
    with pytest.raises(ValueError, match="not one the optimizer was built with"):
        apply_gradients(optimizer, zip(_ones(other), other.trainable_variables))
    assert int(optimizer.iterations.numpy()) == 0


# Optimizers whose weight decay (and EMA overwrite) would move any entry.
_DECAYING = {
    "adamw": lambda: keras.optimizers.AdamW(0.1, weight_decay=0.5),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.5),
    "adamw_ema": lambda: keras.optimizers.AdamW(
        0.1, weight_decay=0.5, use_ema=True, ema_overwrite_frequency=3
    ),
}


@pytest.mark.parametrize("make_optimizer", _DECAYING.values(), ids=_DECAYING.keys())
def test_masked_entries_bit_identical(make_optimizer):
    model, hidden, head = _model(maskfit.OutputMask([1, 0]))
    maskfit.set_mask(hidden, maskfit.ElementMask({"kernel": np.eye(3, 4)}))
    optimizer = _built(make_optimizer(), model)
    frozen_head = head.kernel.numpy()[:, 1].copy(), head.bias.numpy()[1]
    frozen_hidden = hidden.kernel.numpy()[np.eye(3, 4) == 0].copy()
    rng = np.random.default_rng(0)
    for _ in range(4):
        grads = [rng.normal(size=v.shape) for v in model.trainable_variables]
        grads[2][0, 1] = np.nan  # NaN in a frozen entry must not spread.
        apply_gradients(optimizer, grads)
    np.testing.assert_array_equal(head.kernel.numpy()[:, 1], frozen_head[0])
    np.testing.assert_array_equal(head.bias.numpy()[1], frozen_head[1])
    np.testing.assert_array_equal(
        hidden.kernel.numpy()[np.eye(3, 4) == 0], frozen_hidden
    )
    assert np.all(np.isfinite(head.kernel.numpy()))
    assert not np.array_equal(head.kernel.numpy()[:, 0], frozen_head[0])
    assert int(optimizer.iterations.numpy()) == 4


@pytest.mark.parametrize("make_optimizer", _DECAYING.values(), ids=_DECAYING.keys())
def test_left_out_variable_gets_no_update(make_optimizer):
    model, hidden, head = _model()
    optimizer = _built(make_optimizer(), model)
    for _ in range(2):  # Give every variable momentum first.
        apply_gradients(optimizer, _ones(model))
    kernel, bias = hidden.kernel.numpy().copy(), hidden.bias.numpy().copy()
    for _ in range(3):
        apply_gradients(optimizer, {head.kernel.path: np.ones((4, 2))})
        apply_gradients(optimizer, [None, None, None, np.ones(2)])
    np.testing.assert_array_equal(hidden.kernel.numpy(), kernel)
    np.testing.assert_array_equal(hidden.bias.numpy(), bias)


def test_plain_keras_moves_left_out_variable_under_ema():
    """Shows the EMA case above tests something: Keras alone moves it."""
    model, hidden, head = _model()
    optimizer = keras.optimizers.AdamW(
        0.1, weight_decay=0.5, use_ema=True, ema_overwrite_frequency=3
    )
    optimizer.build(model.trainable_variables)
    # Tensors: Keras's torch optimizers take no NumPy gradients.
    ones = [keras.ops.convert_to_tensor(g) for g in _ones(model)]
    optimizer.apply(ones)
    optimizer.apply(ones)
    kernel = hidden.kernel.numpy().copy()
    optimizer.apply_gradients([(keras.ops.ones((2,)), head.bias)])
    assert not np.array_equal(hidden.kernel.numpy(), kernel)


def test_new_mask_values_apply_on_the_next_eager_call():
    model, _, head = _model(maskfit.OutputMask([1, 0]))
    optimizer = _built(keras.optimizers.SGD(1.0), model)
    apply_gradients(optimizer, _ones(model))
    maskfit.set_mask(head, maskfit.OutputMask([0, 1]))
    column0 = head.kernel.numpy()[:, 0].copy()
    apply_gradients(optimizer, _ones(model))
    np.testing.assert_array_equal(head.kernel.numpy()[:, 0], column0)


def test_an_element_mask_of_zeros_freezes_its_variable():
    model, _, head = _model(maskfit.ElementMask({"kernel": np.zeros((4, 2))}))
    optimizer = _built(keras.optimizers.AdamW(0.1, weight_decay=0.5), model)
    kernel = head.kernel.numpy().copy()
    for _ in range(2):
        apply_gradients(optimizer, _ones(model))
    np.testing.assert_array_equal(head.kernel.numpy(), kernel)
    assert not np.array_equal(head.bias.numpy(), np.zeros(2))


# The stateless form, under JAX: `maskfit.stateless_apply` in a `jax.jit` loop.
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


@pytest.mark.backends("jax")
def test_stateless_apply_in_a_jitted_loop_holds_masks_and_takes_new_ones():
    model, _, head = _model(maskfit.OutputMask([1, 0]), activation="tanh")
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


@pytest.mark.backends("jax")
def test_piecewise_mask_switches_at_the_exact_step_inside_the_jitted_function():
    model, _, head = _model(activation="tanh")
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
