"""The guarantee: an entry whose mask is 0 is bit-identical, under every optimizer and setting.

The matrix runs under both backends (Keras's TensorFlow trainer in eager, graph
and jit modes; its JAX trainer eagerly and compiled). Under JAX each optimizer
slot of a variable's shape holds its frozen entries too, and an EMA average holds
the variable's value there (what `finalize_variable_values` copies back): the
stateless step puts them back with `where`.
"""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import maskfit

BACKEND = keras.backend.backend()
from tests.helpers.keras_versions import param_if_shipped

# Every optimizer Keras ships, with a learning rate that moves a tiny model.
OPTIMIZERS = {
    "SGD": lambda **kw: keras.optimizers.SGD(0.1, **kw),
    "SGD_nesterov": lambda **kw: keras.optimizers.SGD(
        0.1, momentum=0.9, nesterov=True, **kw
    ),
    "Adam": lambda **kw: keras.optimizers.Adam(0.05, **kw),
    "AdamW": lambda **kw: keras.optimizers.AdamW(0.05, **kw),
    "Adamax": lambda **kw: keras.optimizers.Adamax(0.05, **kw),
    "Nadam": lambda **kw: keras.optimizers.Nadam(0.05, **kw),
    "RMSprop_momentum": lambda **kw: keras.optimizers.RMSprop(0.05, momentum=0.9, **kw),
    "Adagrad": lambda **kw: keras.optimizers.Adagrad(0.1, **kw),
    "Adadelta": lambda **kw: keras.optimizers.Adadelta(1.0, **kw),
    "Ftrl": lambda **kw: keras.optimizers.Ftrl(
        0.1, l1_regularization_strength=0.01, **kw
    ),
    "Lion": lambda **kw: keras.optimizers.Lion(0.01, **kw),
    "Lamb": lambda **kw: keras.optimizers.Lamb(0.05, **kw),
    "Adafactor": lambda **kw: keras.optimizers.Adafactor(0.05, **kw),
    "Muon": lambda **kw: keras.optimizers.Muon(0.05, **kw),
    "ScheduleFreeAdamW": lambda **kw: keras.optimizers.ScheduleFreeAdamW(0.05, **kw),
}

# Each setting that can move a zero-gradient entry, alone.
SETTINGS = {
    "weight_decay": dict(weight_decay=0.1),
    "clipnorm": dict(clipnorm=0.1),
    "clipvalue": dict(clipvalue=0.01),
    "global_clipnorm": dict(global_clipnorm=0.1),
    "ema_overwrite": dict(use_ema=True, ema_momentum=0.9, ema_overwrite_frequency=3),
    "gradient_accumulation": dict(gradient_accumulation_steps=2),
}
# All of them at once that Keras allows together (one kind of clipping at a time).
KITCHEN_SINK = dict(
    weight_decay=0.1, global_clipnorm=1.0, use_ema=True, ema_overwrite_frequency=2
)
KITCHEN_SETTINGS = ("weight_decay", "global_clipnorm", "ema_overwrite")
# The settings the kitchen sink leaves out, and loss scaling (mixed_float16).
ALONE = ("clipnorm", "clipvalue", "gradient_accumulation", "loss_scale")


def test_every_optimizer_keras_ships_is_covered():
    shipped = {
        name
        for name, cls in vars(keras.optimizers).items()
        if inspect.isclass(cls)
        and issubclass(cls, keras.optimizers.Optimizer)
        and name not in ("Optimizer", "LossScaleOptimizer", "MultiOptimizer")
    }
    covered = {name.split("_")[0] for name in OPTIMIZERS}
    assert shipped <= covered, f"Not covered: {shipped - covered}"


def build_model(constraint=None):
    """Input(4) -> Dense(6, tanh) 'hidden' -> Dense(3) 'head', both masked."""
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(
        6, activation="tanh", name="hidden", kernel_constraint=constraint
    )
    head = keras.layers.Dense(3, name="head", kernel_constraint=constraint)
    model = maskfit.MaskedModel(inputs, head(hidden(inputs)))
    # Output 1 is frozen from the start; output 2 learns at half the rate.
    maskfit.set_mask(head, maskfit.OutputMask([1, 0, 0.5]))
    # The hidden kernel learns freely at first, so optimizers build up history.
    maskfit.set_mask(hidden, maskfit.ElementMask({"kernel": np.ones((4, 6))}))
    return model, hidden, head


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = rng.normal(size=(n, 3)).astype("float32") * 3
    return x, y


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


def train_and_check(optimizer, mode, constraint=None, model_cls=None, policy=None):
    """Trains with history, then freezes entries; asserts they never move."""
    if policy is not None:
        keras.config.set_dtype_policy(policy)
    model, hidden, head = build_model(constraint)
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
    # The JAX and torch steps hold the slots too; TensorFlow's restores the
    # variable (and its EMA average) after the update, and leaves slots be.
    slots, average = [], None
    if BACKEND in ("jax", "torch"):
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


@pytest.mark.backends("tensorflow", "jax", "torch")
@pytest.mark.fused_too  # also with the masked update compiled by XLA
# Under TensorFlow its eager and jit cases run with the slow tests (.ci/run
# runs both): README's test command keeps every optimizer in graph mode and, in
# every mode, the settings test below.
@pytest.mark.other_modes_slow
@pytest.mark.parametrize(
    "name", [param_if_shipped(name) for name in sorted(OPTIMIZERS)]
)
def test_frozen_entries_hold_for_every_optimizer_with_every_setting(name, mode):
    train_and_check(OPTIMIZERS[name](**KITCHEN_SINK), mode)


def _setting(name, setting, mode):
    if setting == "loss_scale":
        model = train_and_check(OPTIMIZERS[name](), mode, policy="mixed_float16")
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    else:
        train_and_check(OPTIMIZERS[name](**SETTINGS[setting]), mode)


# The settings the kitchen sink leaves out (it runs the others with every
# optimizer), alone.
@pytest.mark.backends("tensorflow", "jax", "torch")
@pytest.mark.parametrize("setting", ALONE)
@pytest.mark.parametrize("name", ["AdamW", "SGD_nesterov"])
def test_frozen_entries_hold_under_each_setting(name, setting, mode):
    _setting(name, setting, mode)


# Under JAX, every other optimizer too, compiled.
@pytest.mark.backends("jax")
@pytest.mark.parametrize("setting", ALONE)
@pytest.mark.parametrize(
    "name",
    [
        param_if_shipped(n)
        for n in sorted(OPTIMIZERS)
        if n not in ("AdamW", "SGD_nesterov")
    ],
)
def test_frozen_entries_hold_under_each_setting_compiled(name, setting):
    _setting(name, setting, dict(jit_compile=True))


@pytest.mark.fused_too  # also with the masked update compiled by XLA
def test_frozen_entries_hold_under_variable_constraints(mode):
    train_and_check(
        OPTIMIZERS["Adam"](), mode, constraint=keras.constraints.MaxNorm(0.5)
    )


@pytest.mark.backends("tensorflow", "jax", "torch")
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


@pytest.mark.backends("tensorflow", "jax", "torch")
@pytest.mark.fused_too  # also with the masked update compiled by XLA
@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_nan_and_inf_in_frozen_gradients_never_reach_the_weights(name, mode):
    model = train_and_check(OPTIMIZERS[name](), mode, model_cls=NaNInFrozenEntries)
    for weight in model.trainable_weights:
        assert np.all(np.isfinite(np.array(weight))), weight.path


def test_frozen_entries_do_not_inflate_the_global_norm():
    """With global clipping, only what may learn counts towards the norm."""
    inputs = keras.Input((2,))
    head = maskfit.set_mask(
        keras.layers.Dense(2, name="head"), maskfit.OutputMask([1, 0])
    )
    model = maskfit.MaskedModel(inputs, head(inputs))
    model.compile(optimizer=keras.optimizers.SGD(1.0, global_clipnorm=0.01), loss="mse")
    x = np.ones((4, 2), "float32")
    y = np.array([[1.0, 1e6]] * 4, "float32")  # a huge error on the frozen output
    kernel0, bias0 = head.kernel.numpy(), head.bias.numpy()
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, model(x))
        loss = tf.reduce_mean(loss)
    g_kernel, g_bias = tape.gradient(loss, [head.kernel, head.bias])
    g_kernel, g_bias = g_kernel.numpy()[:, 0], g_bias.numpy()[0]
    norm = np.sqrt(np.sum(g_kernel**2) + g_bias**2)
    scale = 0.01 / max(norm, 0.01)
    model.train_on_batch(x, y)
    np.testing.assert_allclose(
        head.kernel.numpy()[:, 0], kernel0[:, 0] - g_kernel * scale, rtol=1e-5
    )
    np.testing.assert_allclose(
        head.bias.numpy()[0], bias0[0] - g_bias * scale, rtol=1e-5
    )
    np.testing.assert_array_equal(head.kernel.numpy()[:, 1], kernel0[:, 1])


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.fused_too  # also with the masked update compiled by XLA
def test_backprop_gate_blocks_what_frozen_units_send_upstream(mode):
    """With backprop=True, upstream layers learn only from unfrozen units."""

    def build(backprop):
        keras.utils.set_random_seed(7)
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(4, activation="tanh", name="hidden")
        head = keras.layers.Dense(2, name="head")
        model = maskfit.MaskedModel(inputs, head(hidden(inputs)))
        maskfit.set_mask(head, maskfit.OutputMask([1, 0], backprop=backprop))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", **mode)
        return model, hidden

    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    gated, gated_hidden = build(True)
    gated.fit(x, y, batch_size=16, epochs=2, verbose=0)
    open_model, open_hidden = build(False)
    open_model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    # Only output 0 trains the hidden layer: same as a target equal to the
    # prediction on output 1 (zero error there), computed by hand.
    reference, reference_hidden = build(False)
    for _ in range(2):
        y_ref = y.copy()
        y_ref[:, 1] = reference.predict(x, verbose=0)[:, 1]
        reference.train_on_batch(x, y_ref)
    np.testing.assert_allclose(
        gated_hidden.kernel.numpy(),
        reference_hidden.kernel.numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    assert np.abs(open_hidden.kernel.numpy() - gated_hidden.kernel.numpy()).max() > 1e-4
    # The forward value is unchanged by the gate.
    with_gate = np.asarray(gated(x))
    maskfit.set_mask(gated.get_layer("head"), maskfit.OutputMask([1, 0]))
    np.testing.assert_array_equal(np.asarray(gated(x)), with_gate)


@settings(max_examples=12, deadline=None)
@given(
    widths=st.lists(st.integers(1, 5), min_size=2, max_size=3),
    seed=st.integers(0, 2**16),
    element=st.booleans(),
)
def test_random_masks_on_random_layer_shapes_hold_exactly(widths, seed, element):
    """Hypothesis: any 0/1 (or fractional) masks, any widths, AdamW + EMA, eager."""
    rng = np.random.default_rng(seed)
    inputs = keras.Input((3,))
    h, layers = inputs, []
    for width in widths:
        layers.append(keras.layers.Dense(width, activation="tanh"))
        h = layers[-1](h)
    model = maskfit.MaskedModel(inputs, h)
    frozen = {}
    for layer in layers:
        if element:
            values = rng.choice([0.0, 0.5, 1.0], size=tuple(layer.kernel.shape))
            maskfit.set_mask(layer, maskfit.ElementMask({"kernel": values}))
            frozen[layer.kernel.path] = (layer.kernel, values == 0)
        else:
            values = rng.choice([0.0, 0.5, 1.0], size=layer.units)
            maskfit.set_mask(layer, maskfit.OutputMask(values))
            for variable in (layer.kernel, layer.bias):
                shape = tuple(variable.shape)
                frozen[variable.path] = (variable, np.broadcast_to(values == 0, shape))
    before = {path: v.numpy().copy() for path, (v, _) in frozen.items()}
    model.compile(
        optimizer=keras.optimizers.AdamW(0.1, use_ema=True, ema_overwrite_frequency=2),
        loss="mse",
        run_eagerly=True,
    )
    x = rng.normal(size=(8, 3)).astype("float32")
    model.fit(x, rng.normal(size=(8, widths[-1])), batch_size=4, epochs=2, verbose=0)
    for path, (variable, is_frozen) in frozen.items():
        np.testing.assert_array_equal(
            variable.numpy()[is_frozen], before[path][is_frozen]
        )
        if (~is_frozen).any():
            assert np.any(variable.numpy()[~is_frozen] != before[path][~is_frozen]), (
                path
            )


@pytest.mark.backends("jax")
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
