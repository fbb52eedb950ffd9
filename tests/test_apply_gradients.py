"""Tests of maskfit.apply.apply_gradients: input forms, checks, exact freezing."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit.apply import apply_gradients


def _model(mask=None):
    """Input(3) -> Dense(4) -> Dense(2) head, optionally masked; returns both."""
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, activation="relu")
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
    return [
        (good[:3], ValueError, r"3 gradients for 4 variables.*\(4, 2\)"),
        ({"dense_kernal": 1.0}, ValueError, "unknown variable path"),
        ({head.kernel.path + "x": good[2]}, ValueError, "Did you mean"),
        (good[:3] + [np.ones((5, 2))], ValueError, r"\(5, 2\).*axes \[0\]"),
        (good[:3] + [np.ones((3,))], ValueError, r"Gradient 3 .*shape \(3,\)"),
        (good[:3] + [np.ones((2,), np.complex64)], TypeError, "complex64"),
        (good[:3] + [np.array(["a", "b"])], TypeError, "cannot be cast"),
        (np.ones(2), TypeError, "single tensor"),
        ([None] * 4, ValueError, "no gradient"),
        (
            {head.bias.path: good[3], head.bias.value.ref(): good[3]},
            ValueError,
            "two gradients",
        ),
    ]


_BAD_CALL_IDS = [
    "count",
    "unknown_path",
    "close_path",
    "summable_shape",
    "shape",
    "complex",
    "string",
    "single_tensor",
    "all_none",
    "duplicate",
]


@pytest.mark.parametrize("case", range(len(_BAD_CALL_IDS)), ids=_BAD_CALL_IDS)
def test_rejected_call_changes_nothing(case):
    model, hidden, head = _model(maskfit.OutputMask([1, 0]))
    optimizer = _built(keras.optimizers.AdamW(0.1, weight_decay=0.5), model)
    apply_gradients(optimizer, _ones(model))
    before, iterations = _values(model), int(optimizer.iterations.numpy())
    grads, error, match = _bad_calls(model, hidden, head)[case]
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


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda: keras.optimizers.AdamW(0.1, weight_decay=0.5),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.5),
    ],
    ids=["adamw", "sgd_momentum"],
)
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


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda: keras.optimizers.AdamW(0.1, weight_decay=0.5),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.5),
        lambda: keras.optimizers.AdamW(
            0.1, weight_decay=0.5, use_ema=True, ema_overwrite_frequency=3
        ),
    ],
    ids=["adamw", "sgd_momentum", "adamw_ema"],
)
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
    optimizer.apply(_ones(model))
    optimizer.apply(_ones(model))
    kernel = hidden.kernel.numpy().copy()
    optimizer.apply_gradients([(np.ones((2,), np.float32), head.bias)])
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
