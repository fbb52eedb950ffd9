"""A mask value m is a learning-rate multiplier: the entry learns as under its own
optimizer at learning rate x m, weight decay included (issue 24), through `fit`.

Under both backends: the reference is stock Keras stepping each head with its own
optimizer, its gradients from TensorFlow's tape or from `jax.grad`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from tests.helpers.keras_versions import param_if_shipped
from tests.step.test_exactness import OPTIMIZERS

pytestmark = pytest.mark.backends("tensorflow", "jax", "torch")
BACKEND = keras.backend.backend()

RATES = {"a": 0.1, "b": 0.5, "c": 3.0, "d": 1.0, "e": 0.0}
LEARNING_RATE = 0.02


def schedule(m=1.0):
    # lr_t = 0.02 * 0.9 ** (t / 10): a schedule on, as users have.
    return keras.optimizers.schedules.ExponentialDecay(LEARNING_RATE * m, 10, 0.9)


def make_optimizer(name, m=1.0):
    optimizer = OPTIMIZERS[name](weight_decay=0.05)
    optimizer.learning_rate = schedule(m)
    return optimizer


def heads():
    """Five parallel Dense(3) heads on one input: each one's gradient is its own."""
    keras.utils.set_random_seed(11)
    inputs = keras.Input((4,))
    layers = {k: keras.layers.Dense(3, name=k) for k in RATES}
    outputs = keras.layers.Concatenate()([layers[k](inputs) for k in RATES])
    return inputs, outputs, layers


def data():
    rng = np.random.default_rng(5)
    return rng.normal(size=(48, 4)).astype("float32"), rng.normal(size=(48, 15)).astype(
        "float32"
    )


def masked_run(name, mode, steps=24):
    inputs, outputs, layers = heads()
    model = maskfit.MaskedModel(inputs, outputs)
    for key, m in RATES.items():
        if m != 1.0:
            maskfit.set_mask(layers[key], maskfit.ElementMask({"kernel": m, "bias": m}))
    start = _weights(layers)
    model.compile(optimizer=make_optimizer(name), loss="mse", **mode)
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=steps // 6, shuffle=False, verbose=0)
    return start, _weights(layers)


def _weights(layers):
    return {k: [np.array(v) for v in layer.weights] for k, layer in layers.items()}


def _tensorflow_step(model, groups, optimizers, mode):
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = tf.reduce_mean(loss)
        gradients = tape.gradient(loss, groups)
        for optimizer, variables, grads in zip(optimizers, groups, gradients):
            optimizer.apply(grads, variables)

    if not mode.get("run_eagerly"):
        step = tf.function(step, jit_compile=bool(mode.get("jit_compile")))
    return step


def _jax_step(model, groups, optimizers, mode):
    import jax

    variables = model.trainable_variables

    def loss(values, x, y):
        y_pred, _ = model.stateless_call(values, [], x, training=True)
        return keras.ops.mean(keras.losses.mean_squared_error(y, y_pred))

    gradient = jax.jit(jax.grad(loss))

    def step(x, y):
        grads = gradient([v.value for v in variables], x, y)
        by_id = {id(v): g for v, g in zip(variables, grads)}
        for optimizer, own in zip(optimizers, groups):
            optimizer.apply([by_id[id(v)] for v in own], own)

    return step


def _torch_step(model, groups, optimizers, mode):
    import torch

    variables = model.trainable_variables

    def step(x, y):
        model.zero_grad()
        loss = keras.losses.mean_squared_error(y, model(x, training=True))
        keras.ops.mean(loss).backward()
        by_id = {id(v): v.value.grad for v in variables}
        with torch.no_grad():
            for optimizer, own in zip(optimizers, groups):
                optimizer.apply([by_id[id(v)] for v in own], own)

    return step


_STEPS = {"jax": _jax_step, "torch": _torch_step}


def reference_run(name, mode, steps=24):
    """Stock Keras: each head trained by its own optimizer at learning rate x m."""
    inputs, outputs, layers = heads()
    model = keras.Model(inputs, outputs)
    optimizers = {k: make_optimizer(name, m) for k, m in RATES.items() if m}
    for k, optimizer in optimizers.items():
        optimizer.build(layers[k].trainable_weights)
    groups = [layers[k].trainable_weights for k in optimizers]
    make_step = _STEPS.get(BACKEND, _tensorflow_step)
    step = make_step(model, groups, list(optimizers.values()), mode)
    x, y = data()
    for _ in range(steps // 6):
        for i in range(0, 48, 8):
            step(x[i : i + 8], y[i : i + 8])
    return _weights(layers)


def check(name, mode):
    start, masked = masked_run(name, mode)
    reference = reference_run(name, mode)
    for k, m in RATES.items():
        for got, want, first in zip(masked[k], reference[k], start[k]):
            if m == 0:
                np.testing.assert_array_equal(got, first)  # frozen: bit for bit
            else:
                np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6, err_msg=k)
                assert np.any(got != first)


# Every optimizer Keras ships, compiled (graph mode; JAX jits it); a few, in
# every mode.
@pytest.mark.parametrize("name", [param_if_shipped(n) for n in sorted(OPTIMIZERS)])
def test_a_multiplier_is_its_own_optimizer_at_learning_rate_times_m(name):
    check(name, {})


@pytest.mark.parametrize("name", ["SGD_nesterov", "AdamW", "Adafactor"])
def test_multipliers_in_every_mode(name, mode):
    check(name, mode)


def test_m_equal_to_1_is_stock_keras_bit_for_bit(mode):
    _, masked = masked_run("AdamW", mode)
    inputs, outputs, layers = heads()
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=make_optimizer("AdamW"), loss="mse", **mode)
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0)
    for got, want in zip(masked["d"], layers["d"].weights):
        np.testing.assert_array_equal(got, np.array(want))


def _moved(scale, optimizer):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((4,))
    head = keras.layers.Dense(2)
    model = maskfit.MaskedModel(inputs, head(inputs))
    maskfit.set_mask(head, maskfit.OutputMask([1.0, 0.1], scale=scale))
    before = np.array(head.kernel)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = data()
    model.fit(x, y[:, :2], batch_size=8, epochs=1, shuffle=False, verbose=0)
    change = np.abs(np.array(head.kernel) - before).mean(axis=0)
    return change[1] / change[0]


def test_gradient_scaling_stays_available_by_name():
    # The measurement: under Adam a 0.1 gradient scale is divided out,
    # a 0.1 learning-rate multiplier is not.
    assert _moved("step", keras.optimizers.Adam(0.01)) < 0.2
    assert _moved("gradient", keras.optimizers.Adam(0.01)) > 0.5
    with pytest.raises(ValueError, match="scale must be 'step'.*Received: scale='lr'"):
        maskfit.OutputMask([1, 0.5], scale="lr")


def test_gradual_unfreezing_0_then_a_tenth_then_1_in_one_trace():
    traces = []

    class Counting(maskfit.MaskedModel):
        def train_step(self, *args):  # (data); JAX's (state, data)
            traces.append(1)
            return super().train_step(*args)

    inputs, outputs, layers = heads()
    model = Counting(inputs, outputs)
    schedule_spec = maskfit.PiecewiseMask(
        [6, 12], [maskfit.ElementMask({"kernel": m}) for m in (0.0, 0.1, 1.0)]
    )
    maskfit.set_mask(layers["a"], schedule_spec)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y = data()
    kernels = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if BACKEND == "jax":
                self.model.jax_state_sync()  # the values live in fit's state
            kernels.append(np.array(layers["a"].kernel))

    first = np.array(layers["a"].kernel)
    model.fit(
        x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[Record()]
    )
    np.testing.assert_array_equal(kernels[5], first)  # frozen for steps 0-5
    slow = np.abs(kernels[11] - kernels[5]).mean()
    fast = np.abs(kernels[17] - kernels[11]).mean()
    assert 0 < slow < fast / 3
    # TensorFlow: traced once, then once more when the frozen variable joins
    # the step (at step 6); 0.1 -> 1 is a new value of the same state, no
    # retrace. On JAX a variable frozen whole stays in the step (masked and
    # held), so the schedule is values of one traced step: traced once. Torch
    # runs the step eagerly: once per batch.
    assert len(traces) == {"tensorflow": 2, "jax": 1, "torch": 18}[BACKEND]


@pytest.mark.backends("jax")
def test_piecewise_mask_switches_at_the_exact_step_within_steps_per_execution():
    inputs, outputs, layers = heads()
    model = maskfit.MaskedModel(inputs, outputs)
    maskfit.set_mask(
        layers["a"],
        maskfit.PiecewiseMask(
            [5], [maskfit.OutputMask([1, 0, 1]), maskfit.OutputMask([0, 1, 1])]
        ),
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss="mse",
        jit_compile=True,
        steps_per_execution=3,
    )
    x, y = data()
    first = np.array(layers["a"].kernel)
    model.fit(x[:40], y[:40], batch_size=8, epochs=1, shuffle=False, verbose=0)
    # Steps 0-4: unit 1 frozen; step 5 never ran (5 batches): unit 0 learned.
    np.testing.assert_array_equal(np.array(layers["a"].kernel)[:, 1], first[:, 1])
    assert np.all(np.array(layers["a"].kernel)[:, 0] != first[:, 0])
    at_five = np.array(layers["a"].kernel)
    model.fit(x[:8], y[:8], batch_size=8, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_array_equal(np.array(layers["a"].kernel)[:, 0], at_five[:, 0])
    assert np.all(np.array(layers["a"].kernel)[:, 1] != at_five[:, 1])
