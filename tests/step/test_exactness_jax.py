"""Under JAX, an entry whose mask is 0 is bit-identical, under every optimizer and setting.

The matrix of tests/test_exactness.py (its optimizers, settings, model and
data), run by Keras's JAX trainer compiled and eagerly; each optimizer slot
of a variable's shape holds its frozen entries too, and an EMA average holds
the variable's value there (what `finalize_variable_values` copies back).
"""

import keras
import numpy as np
import pytest

import maskfit
from tests.helpers.keras_versions import param_if_shipped
from tests.step.test_exactness import (
    KITCHEN_SINK,
    OPTIMIZERS,
    SETTINGS,
    build_model,
    data,
)

pytestmark = pytest.mark.backends("jax")

# The settings the kitchen sink leaves out, and loss scaling (mixed_float16).
ALONE = ("clipnorm", "clipvalue", "gradient_accumulation", "loss_scale")


def _slots_of(optimizer, variable):
    """`(slots, average)`: the variable's optimizer slots of its shape, its EMA average."""
    name = variable.path.replace("/", "_")
    slots, average = [], None
    for slot in optimizer.variables:
        if tuple(slot.shape) != tuple(variable.shape) or name not in slot.path:
            continue
        if slot.path.endswith("_average"):
            average = slot
        else:
            slots.append(slot)
    return slots, average


def train_and_check(optimizer, mode, policy=None, model_cls=None):
    """Trains with history, then freezes entries; asserts they never move."""
    if policy is not None:
        keras.config.set_dtype_policy(policy)
    model, hidden, head = build_model()
    if model_cls is not None:
        model = model_cls(model.inputs, model.outputs)
    model.compile(optimizer=optimizer, loss="mse", **mode)
    x, y = data()
    head_kernel0, head_bias0 = np.array(head.kernel), np.array(head.bias)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # history for all of hidden
    freeze = np.random.default_rng(1).random((4, 6)) < 0.5
    maskfit.set_mask(
        hidden, maskfit.ElementMask({"kernel": (~freeze).astype("float32")})
    )
    hidden_kernel1 = np.array(hidden.kernel)
    slots, average = _slots_of(model.optimizer, hidden.kernel)
    slots1 = [np.array(s) for s in slots]
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)

    np.testing.assert_array_equal(np.array(head.kernel)[:, 1], head_kernel0[:, 1])
    np.testing.assert_array_equal(np.array(head.bias)[1], head_bias0[1])
    np.testing.assert_array_equal(
        np.array(hidden.kernel)[freeze], hidden_kernel1[freeze]
    )
    for slot, before in zip(slots, slots1):
        np.testing.assert_array_equal(np.array(slot)[freeze], before[freeze], slot.path)
    if average is not None:
        np.testing.assert_array_equal(
            np.array(average)[freeze], hidden_kernel1[freeze], average.path
        )
    # And what may learn did learn.
    assert np.any(np.array(head.kernel)[:, 0] != head_kernel0[:, 0])
    assert np.any(np.array(head.kernel)[:, 2] != head_kernel0[:, 2])
    assert np.any(np.array(hidden.kernel)[~freeze] != hidden_kernel1[~freeze])
    return model


@pytest.mark.parametrize("name", [param_if_shipped(n) for n in sorted(OPTIMIZERS)])
def test_frozen_entries_hold_for_every_optimizer_with_every_setting(name, mode):
    train_and_check(OPTIMIZERS[name](**KITCHEN_SINK), mode)


def _setting(name, setting, mode):
    if setting == "loss_scale":
        model = train_and_check(OPTIMIZERS[name](), mode, policy="mixed_float16")
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    else:
        train_and_check(OPTIMIZERS[name](**SETTINGS[setting]), mode)


@pytest.mark.parametrize("setting", ALONE)
@pytest.mark.parametrize("name", [param_if_shipped(n) for n in sorted(OPTIMIZERS)])
def test_frozen_entries_hold_under_each_setting_compiled(name, setting):
    _setting(name, setting, dict(jit_compile=True))


@pytest.mark.parametrize("setting", ALONE)
@pytest.mark.parametrize("name", ["AdamW", "SGD_nesterov"])
def test_frozen_entries_hold_under_each_setting_eagerly(name, setting):
    _setting(name, setting, dict(run_eagerly=True))


def test_ema_finalize_at_the_end_of_fit_cannot_move_frozen_entries():
    # No overwrite during training: only finalize_variable_values copies the
    # averages into the model, after the last step.
    train_and_check(OPTIMIZERS["Adam"](use_ema=True, ema_momentum=0.5), {})


class NaNInFrozenEntries(maskfit.MaskedModel):
    """Puts NaN and Inf into the gradient of every frozen entry, then masks."""

    def apply_grad_masks(self, gradients, variables):
        poisoned = []
        frozen = keras.ops.convert_to_tensor([False, True, False])
        for gradient, variable in zip(gradients, variables):
            if variable.path.endswith("head/kernel"):
                gradient = keras.ops.where(frozen, np.float32(np.nan), gradient)
            if variable.path.endswith("head/bias"):
                gradient = keras.ops.where(frozen, np.float32(np.inf), gradient)
            poisoned.append(gradient)
        return super().apply_grad_masks(poisoned, variables)


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_nan_and_inf_in_frozen_gradients_never_reach_the_weights(name, mode):
    model = train_and_check(OPTIMIZERS[name](), mode, model_cls=NaNInFrozenEntries)
    for weight in model.trainable_weights:
        assert np.all(np.isfinite(np.array(weight))), weight.path


def test_fit_no_longer_fails_on_distribute_strategy():
    # The report: `fit` raised AttributeError: 'MaskedModel' object has
    # no attribute 'distribute_strategy'. Sequential too.
    head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([0, 1]))
    model = maskfit.MaskedSequential([keras.Input((3,)), head])
    model.compile(optimizer="adamw", loss="mse")
    kernel0 = np.array(head.kernel)
    history = model.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    np.testing.assert_array_equal(np.array(head.kernel)[:, 0], kernel0[:, 0])
    assert model.evaluate(np.ones((8, 3)), np.ones((8, 2)), verbose=0) >= 0
    assert model.predict(np.ones((8, 3)), verbose=0).shape == (8, 2)
