"""Under JAX, a mask value m is a learning-rate multiplier, as tests/test_step_multipliers.py
checks on TensorFlow: the entry learns as under its own optimizer at learning rate x m,
weight decay included, through `fit`."""

import jax
import keras
import numpy as np
import pytest

import maskfit
from tests.helpers.keras_versions import param_if_shipped
from tests.optim.test_step_multipliers import (
    RATES,
    _moved,
    data,
    heads,
    make_optimizer,
    masked_run,
)
from tests.step.test_exactness import OPTIMIZERS

pytestmark = pytest.mark.backends("jax")


def reference_run(name, steps=24):
    """Stock Keras on JAX: each head stepped by its own optimizer at learning rate x m."""
    inputs, outputs, layers = heads()
    model = keras.Model(inputs, outputs)
    optimizers = {k: make_optimizer(name, m) for k, m in RATES.items() if m}
    for k, optimizer in optimizers.items():
        optimizer.build(layers[k].trainable_weights)
    variables = model.trainable_variables

    def loss(values, x, y):
        y_pred, _ = model.stateless_call(values, [], x, training=True)
        return keras.ops.mean(keras.losses.mean_squared_error(y, y_pred))

    gradient = jax.jit(jax.grad(loss))
    x, y = data()
    for _ in range(steps // 6):
        for i in range(0, 48, 8):
            grads = gradient([v.value for v in variables], x[i : i + 8], y[i : i + 8])
            by_id = {id(v): g for v, g in zip(variables, grads)}
            for k, optimizer in optimizers.items():
                own = layers[k].trainable_weights
                optimizer.apply([by_id[id(v)] for v in own], own)
    return {k: [np.array(v) for v in layer.weights] for k, layer in layers.items()}


def check(name, mode):
    start, masked = masked_run(name, mode)
    reference = reference_run(name)
    for k, m in RATES.items():
        for got, want, first in zip(masked[k], reference[k], start[k]):
            if m == 0:
                np.testing.assert_array_equal(got, first)  # frozen: bit for bit
            else:
                np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6, err_msg=k)
                assert np.any(got != first)


# Every optimizer Keras ships, compiled; a few, eagerly too.
@pytest.mark.parametrize("name", [param_if_shipped(n) for n in sorted(OPTIMIZERS)])
def test_a_multiplier_is_its_own_optimizer_at_learning_rate_times_m(name):
    check(name, dict(jit_compile=True))


@pytest.mark.parametrize("name", ["SGD_nesterov", "AdamW", "Adafactor"])
def test_multipliers_eagerly(name):
    check(name, dict(run_eagerly=True))


def test_m_equal_to_1_is_stock_keras_bit_for_bit(mode):
    _, masked = masked_run("AdamW", mode)
    inputs, outputs, layers = heads()
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=make_optimizer("AdamW"), loss="mse", **mode)
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0)
    for got, want in zip(masked["d"], layers["d"].weights):
        np.testing.assert_array_equal(got, np.array(want))


def test_gradient_scaling_stays_available_by_name():
    # Under Adam a 0.1 gradient scale is divided out, a 0.1 multiplier is not.
    assert _moved("step", keras.optimizers.Adam(0.01)) < 0.2
    assert _moved("gradient", keras.optimizers.Adam(0.01)) > 0.5


def test_gradual_unfreezing_0_then_a_tenth_then_1_in_one_trace():
    traces = []

    class Counting(maskfit.MaskedModel):
        def train_step(self, state, data):
            traces.append(1)
            return super().train_step(state, data)

    inputs, outputs, layers = heads()
    model = Counting(inputs, outputs)
    schedule_spec = maskfit.PiecewiseMask(
        [6, 12], [maskfit.ElementMask({"kernel": m}) for m in (0.0, 0.1, 1.0)]
    )
    maskfit.set_mask(layers["a"], schedule_spec)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=True)
    x, y = data()
    kernels = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
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
    # On JAX a variable frozen whole stays in the step (masked and held), so
    # the schedule is values of one traced step: traced once.
    assert len(traces) == 1


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
