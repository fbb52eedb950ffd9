"""Frozen entries stay exact under mixed_float16 (loss scaling) and mixed_bfloat16."""

import keras
import numpy as np
import pytest

import maskfit
from maskfit import distribute
from tests.helpers import distributed_runs

POLICIES = ["mixed_float16", "mixed_bfloat16"]
# How closely MaskedModel without masks follows keras.Model in each policy.
TOLERANCE = {
    "mixed_float16": dict(rtol=1e-3, atol=1e-4),
    "mixed_bfloat16": dict(rtol=1e-2, atol=1e-3),
}


@pytest.fixture(params=POLICIES)
def policy(request):
    """Sets a mixed policy for the test and restores the previous one after."""
    previous = distribute.set_precision(request.param)
    yield request.param
    distribute.set_precision(previous)


def _train(policy, optimizer, compile_kwargs=None, masks=True, model_cls=None):
    return distributed_runs.train(
        distribute.make_strategy("default"),
        optimizer,
        compile_kwargs or {},
        policy,
        masks=masks,
        model_cls=model_cls,
    )


def test_frozen_entries_hold_with_weight_decay_and_history(policy, mode):
    # hidden's kernel learns for an epoch, then part of it is frozen; Scale
    # (a maskfit.custom_gradient layer) and two OutputMasks are masked too.
    result = _train(
        policy, lambda: keras.optimizers.AdamW(0.02, weight_decay=0.1), mode
    )
    distributed_runs.assert_frozen_and_learning(result)
    scaled = str(result["optimizer"]) == "LossScaleOptimizer"
    assert scaled == (policy == "mixed_float16")


def test_frozen_entries_hold_with_gradient_accumulation(policy):
    result = _train(
        policy,
        lambda: keras.optimizers.SGD(
            0.1, momentum=0.9, weight_decay=0.1, gradient_accumulation_steps=2
        ),
    )
    distributed_runs.assert_frozen_and_learning(result)


def test_without_masks_training_matches_stock_keras(policy):
    optimizer = lambda: keras.optimizers.Adam(0.02)  # noqa: E731
    stock = _train(policy, optimizer, masks=False, model_cls=keras.Model)
    masked = _train(policy, optimizer, masks=False)
    assert str(masked["optimizer"]) == str(stock["optimizer"])
    np.testing.assert_allclose(masked["loss"], stock["loss"], **TOLERANCE[policy])
    for key in stock:
        if key.startswith("after/"):
            np.testing.assert_allclose(
                masked[key], stock[key], err_msg=key, **TOLERANCE[policy]
            )


# Loss scaling: a step with a non-finite gradient is skipped, unless the
# non-finite values are only in frozen entries, which never learn.


def _model(mode, gated, model_cls=maskfit.MaskedModel, masked=True):
    """A head whose output 1 is frozen, after one Adam step on all of it.

    `gated`: the head sits on a hidden layer and its mask blocks backprop, so
    nothing upstream learns from output 1 either. Otherwise the head reads
    the inputs, and a huge error on output 1 reaches only its frozen weights.
    """
    distribute.set_precision("mixed_float16")
    keras.utils.set_random_seed(3)
    inputs = keras.Input((3,))
    outputs = inputs
    if gated:
        outputs = keras.layers.Dense(4, activation="tanh", name="hidden")(outputs)
    head = keras.layers.Dense(2, name="head")
    model = model_cls(inputs, head(outputs))
    if masked:
        maskfit.set_mask(head, maskfit.OutputMask([1, 0], backprop=gated))
    model.compile(
        optimizer=keras.optimizers.AdamW(0.01, weight_decay=0.1), loss="mse", **mode
    )
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    model.train_on_batch(x, np.zeros((4, 2), "float32"))
    return model, x


def _state(model):
    weights = [w.numpy() for w in model.trainable_weights]
    optimizer = model.optimizer
    return weights, int(optimizer.iterations.numpy()), float(optimizer.dynamic_scale)


def _overflow(output):
    """Targets whose error on `output` overflows float16 once loss-scaled."""
    y = np.zeros((4, 2), "float32")
    y[:, output] = 1e6
    return y


@pytest.fixture
def float16():
    yield
    distribute.set_precision("float32")


def test_overflow_in_a_learning_output_skips_the_step(mode, float16):
    model, x = _model(mode, gated=True)
    weights, iterations, scale = _state(model)
    model.train_on_batch(x, _overflow(output=0))
    new_weights, new_iterations, new_scale = _state(model)
    assert (new_iterations, new_scale) == (iterations, scale / 2)
    for before, after in zip(weights, new_weights):
        np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("gated", [False, True], ids=["weights", "backprop"])
def test_overflow_only_in_frozen_entries_does_not_skip_the_step(mode, gated, float16):
    model, x = _model(mode, gated)
    head = model.get_layer("head")
    kernel, bias = head.kernel.numpy(), head.bias.numpy()
    _, iterations, scale = _state(model)
    model.train_on_batch(x, _overflow(output=1))
    _, new_iterations, new_scale = _state(model)
    assert (new_iterations, new_scale) == (iterations + 1, scale)
    np.testing.assert_array_equal(head.kernel.numpy()[:, 1], kernel[:, 1])
    np.testing.assert_array_equal(head.bias.numpy()[1], bias[1])
    assert np.all(head.kernel.numpy()[:, 0] != kernel[:, 0])
    for weight in model.trainable_weights:
        assert np.all(np.isfinite(weight.numpy())), weight.path


def test_stock_keras_skips_that_step(float16):
    """The control: without the mask, the same overflow skips the step."""
    model, x = _model({}, gated=False, model_cls=keras.Model, masked=False)
    _, iterations, scale = _state(model)
    model.train_on_batch(x, _overflow(output=1))
    assert _state(model)[1:] == (iterations, scale / 2)
