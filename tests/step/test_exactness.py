"""The guarantee: an entry whose mask is 0 is bit-identical, under every optimizer and setting."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import maskfit
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


def train_and_check(optimizer, mode, constraint=None, model_cls=None):
    """Trains with history, then freezes entries; asserts they never move."""
    model, hidden, head = build_model(constraint)
    if model_cls is not None:
        model = model_cls(model.inputs, model.outputs)
    model.compile(optimizer=optimizer, loss="mse", **mode)
    x, y = data()
    head_kernel0, head_bias0 = head.kernel.numpy(), head.bias.numpy()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # history for all of hidden
    freeze = np.random.default_rng(1).random((4, 6)) < 0.5
    maskfit.set_mask(
        hidden, maskfit.ElementMask({"kernel": (~freeze).astype("float32")})
    )
    hidden_kernel1 = hidden.kernel.numpy()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)

    np.testing.assert_array_equal(head.kernel.numpy()[:, 1], head_kernel0[:, 1])
    np.testing.assert_array_equal(head.bias.numpy()[1], head_bias0[1])
    np.testing.assert_array_equal(hidden.kernel.numpy()[freeze], hidden_kernel1[freeze])
    # And what may learn did learn.
    assert np.any(head.kernel.numpy()[:, 0] != head_kernel0[:, 0])
    assert np.any(head.kernel.numpy()[:, 2] != head_kernel0[:, 2])
    assert np.any(hidden.kernel.numpy()[~freeze] != hidden_kernel1[~freeze])
    return model


@pytest.mark.fused_too  # also with the masked update compiled by XLA
# Its eager and jit cases run with the slow tests (.ci/run runs both): README's
# test command keeps every optimizer in graph mode and, in every mode, the
# settings test below.
@pytest.mark.other_modes_slow
@pytest.mark.parametrize(
    "name", [param_if_shipped(name) for name in sorted(OPTIMIZERS)]
)
def test_frozen_entries_hold_for_every_optimizer_with_every_setting(name, mode):
    train_and_check(OPTIMIZERS[name](**KITCHEN_SINK), mode)


# The settings the kitchen sink leaves out (it runs the others with every
# optimizer), alone.
@pytest.mark.parametrize("setting", sorted(set(SETTINGS) - set(KITCHEN_SETTINGS)))
@pytest.mark.parametrize("name", ["AdamW", "SGD_nesterov"])
def test_frozen_entries_hold_under_each_setting(name, setting, mode):
    train_and_check(OPTIMIZERS[name](**SETTINGS[setting]), mode)


@pytest.mark.fused_too  # also with the masked update compiled by XLA
def test_frozen_entries_hold_under_variable_constraints(mode):
    train_and_check(
        OPTIMIZERS["Adam"](), mode, constraint=keras.constraints.MaxNorm(0.5)
    )


def test_ema_finalize_at_the_end_of_fit_cannot_move_frozen_entries():
    # No overwrite during training: only finalize_variable_values copies the
    # averages into the model, after the last step.
    train_and_check(OPTIMIZERS["Adam"](use_ema=True, ema_momentum=0.5), {})


class NaNInFrozenEntries(maskfit.MaskedModel):
    """Puts NaN and Inf into the gradient of every frozen entry, then masks."""

    def apply_grad_masks(self, gradients, variables):
        poisoned = []
        for gradient, variable in zip(gradients, variables):
            if variable.path.endswith("head/kernel"):
                frozen = tf.constant([False, True, False])
                gradient = tf.where(frozen, np.float32(np.nan), gradient)
            if variable.path.endswith("head/bias"):
                gradient = tf.where(tf.constant([False, True, False]), np.inf, gradient)
            poisoned.append(gradient)
        return super().apply_grad_masks(poisoned, variables)


@pytest.mark.fused_too  # also with the masked update compiled by XLA
@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_nan_and_inf_in_frozen_gradients_never_reach_the_weights(name, mode):
    model = train_and_check(OPTIMIZERS[name](), mode, model_cls=NaNInFrozenEntries)
    for weight in model.trainable_weights:
        assert np.all(np.isfinite(weight.numpy())), weight.path


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
    with_gate = gated(x).numpy()
    maskfit.set_mask(gated.get_layer("head"), maskfit.OutputMask([1, 0]))
    np.testing.assert_array_equal(gated(x).numpy(), with_gate)


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
