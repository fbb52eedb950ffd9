"""MaskedModel behaves as keras.Model in every mode, and its masks are state, not code."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit


def two_output_model(model_cls):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((5,), name="x")
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    a = keras.layers.Dense(2, name="a")(hidden)
    b = keras.layers.Dense(1, name="b")(hidden)
    return model_cls(inputs, {"a": a, "b": b})


def data(n=48):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 5)).astype("float32")
    y = {
        "a": rng.normal(size=(n, 2)).astype("float32"),
        "b": rng.normal(size=(n, 1)).astype("float32"),
    }
    weights = rng.random(n).astype("float32")
    return x, y, weights


def compile_and_fit(model, mode, steps_per_execution):
    model.compile(
        optimizer=keras.optimizers.AdamW(0.01),
        loss={"a": "mse", "b": keras.losses.Huber()},
        loss_weights={"a": 1.0, "b": 0.5},
        metrics={"a": ["mae"], "b": [keras.metrics.RootMeanSquaredError()]},
        steps_per_execution=steps_per_execution,
        **mode,
    )
    x, y, weights = data()
    return model.fit(
        x, y, sample_weight=weights, batch_size=8, epochs=2, shuffle=False, verbose=0
    )


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_without_masks_it_trains_exactly_like_keras_model(mode, steps_per_execution):
    stock = two_output_model(keras.Model)
    masked = two_output_model(maskfit.MaskedModel)
    for s, m in zip(stock.weights, masked.weights):
        np.testing.assert_array_equal(s.numpy(), m.numpy())
    stock_history = compile_and_fit(stock, mode, steps_per_execution).history
    masked_history = compile_and_fit(masked, mode, steps_per_execution).history

    assert stock_history.keys() == masked_history.keys()
    for key in stock_history:
        np.testing.assert_allclose(masked_history[key], stock_history[key], rtol=1e-6)
    for s, m in zip(stock.weights, masked.weights):
        np.testing.assert_allclose(m.numpy(), s.numpy(), rtol=1e-6, atol=1e-7)

    x, y, weights = data()
    np.testing.assert_allclose(
        masked.evaluate(x, y, sample_weight=weights, verbose=0),
        stock.evaluate(x, y, sample_weight=weights, verbose=0),
        rtol=1e-6,
    )
    for key, value in stock.predict(x, verbose=0).items():
        np.testing.assert_allclose(masked.predict(x, verbose=0)[key], value, rtol=1e-6)


def test_multi_output_masks_freeze_one_head(mode):
    model = two_output_model(maskfit.MaskedModel)
    head_b = model.get_layer("b")
    maskfit.set_mask(head_b, maskfit.OutputMask([0]))
    before = [w.numpy() for w in head_b.weights]
    history = compile_and_fit(model, mode, steps_per_execution=2)
    for weight, old in zip(head_b.weights, before):
        np.testing.assert_array_equal(weight.numpy(), old)
    assert history.history["loss"][-1] < history.history["loss"][0]


class Subclassed(maskfit.MaskedModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.body = keras.layers.Dense(6, activation="tanh")
        self.head = maskfit.set_mask(
            keras.layers.Dense(3), maskfit.OutputMask([0, 1, 1])
        )

    def call(self, x):
        return self.head(self.body(x))


def test_subclassed_model_honours_masks_on_its_layers(mode):
    model = Subclassed()
    model.compile(
        optimizer=keras.optimizers.Lion(0.01, weight_decay=0.5), loss="mse", **mode
    )
    x = np.random.default_rng(1).normal(size=(16, 4)).astype("float32")
    model(x)
    kernel, bias = model.head.kernel.numpy(), model.head.bias.numpy()
    model.fit(x, np.ones((16, 3), "float32"), epochs=2, batch_size=4, verbose=0)
    np.testing.assert_array_equal(model.head.kernel.numpy()[:, 0], kernel[:, 0])
    np.testing.assert_array_equal(model.head.bias.numpy()[0], bias[0])
    assert np.any(model.head.kernel.numpy()[:, 1:] != kernel[:, 1:])


class NoisyGradients(maskfit.MaskedModel):
    """A subclass that adds noise after the masks: the override point."""

    def apply_grad_masks(self, gradients, variables):
        gradients = super().apply_grad_masks(gradients, variables)
        return [g + tf.random.normal(tf.shape(g), stddev=0.1) for g in gradients]


def test_override_point_transforms_gradients_and_frozen_entries_still_hold(mode):
    inputs = keras.Input((3,))
    head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    model = NoisyGradients(inputs, head(inputs))
    model.compile(optimizer="sgd", loss="mse", **mode)
    kernel = head.kernel.numpy()
    x = np.zeros((8, 3), "float32")  # zero inputs: only the noise moves the kernel
    model.fit(x, np.zeros((8, 2), "float32"), epochs=1, batch_size=4, verbose=0)
    np.testing.assert_array_equal(head.kernel.numpy()[:, 1], kernel[:, 1])
    assert np.any(head.kernel.numpy()[:, 0] != kernel[:, 0])


class TraceCounter(maskfit.MaskedModel):
    traces = 0

    def train_step(self, data):
        TraceCounter.traces += 1  # Python side effect: runs once per trace.
        return super().train_step(data)


def test_changing_mask_values_between_fits_needs_no_compile_and_no_retrace():
    TraceCounter.traces = 0
    inputs = keras.Input((3,))
    head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    model = TraceCounter(inputs, head(inputs))
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((8, 3), "float32"), np.full((8, 2), 3.0, "float32")
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    traces = TraceCounter.traces
    kernel = head.kernel.numpy()
    maskfit.set_mask(head, maskfit.OutputMask([0, 1]))  # values change, no compile()
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    assert TraceCounter.traces == traces
    np.testing.assert_array_equal(head.kernel.numpy()[:, 0], kernel[:, 0])
    assert np.any(head.kernel.numpy()[:, 1] != kernel[:, 1])
    # Removing the mask keeps the step too: everything learns again.
    kernel = head.kernel.numpy()
    maskfit.set_mask(head, None)
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    assert TraceCounter.traces == traces
    assert np.all(head.kernel.numpy() != kernel)


def test_a_mask_on_a_new_layer_takes_effect_at_the_next_fit():
    inputs = keras.Input((3,))
    head = keras.layers.Dense(2)
    model = maskfit.MaskedModel(inputs, head(inputs))
    model.compile(optimizer="adamw", loss="mse")
    x, y = np.ones((8, 3), "float32"), np.full((8, 2), 3.0, "float32")
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    maskfit.set_mask(head, maskfit.OutputMask([1, 0]))
    kernel = head.kernel.numpy()
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    np.testing.assert_array_equal(head.kernel.numpy()[:, 1], kernel[:, 1])


class Unbuilt(keras.layers.Layer):
    """A layer without `units`: its spec can only be checked at build time."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 3), name="w")

    def call(self, x):
        return x @ self.w

    def maskfit_output_units(self):
        return maskfit.OutputUnits(3, [(self.w, maskfit.units_along(-1))])


def test_a_spec_that_does_not_fit_fails_at_build_time_and_changes_nothing():
    inputs = keras.Input((2,))
    layer = maskfit.set_mask(Unbuilt(name="custom"), maskfit.OutputMask([1, 0]))
    model = maskfit.MaskedModel(inputs, layer(inputs))
    model.compile(optimizer=keras.optimizers.AdamW(0.1), loss="mse")
    before = layer.w.numpy()
    with pytest.raises(
        ValueError, match=r"layer 'custom' has 2 values .* 3 output units"
    ):
        model.fit(np.ones((4, 2)), np.ones((4, 3)), verbose=0)
    np.testing.assert_array_equal(layer.w.numpy(), before)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_functional_use_leaves_the_class_usable_as_a_base_class():
    inputs = keras.Input((4,))
    functional = maskfit.MaskedModel(inputs, keras.layers.Dense(3)(inputs))
    assert isinstance(functional, maskfit.MaskedModel)
    assert isinstance(Subclassed(), maskfit.MaskedModel)  # would fail if bases changed
    assert keras.Model in maskfit.MaskedModel.__bases__
    assert not any("Functional" in c.__name__ for c in maskfit.MaskedModel.__mro__)


def test_functional_masked_model_saves_and_loads_without_custom_objects(tmp_path):
    inputs = keras.Input((4,))
    model = maskfit.MaskedModel(inputs, keras.layers.Dense(3)(inputs))
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 3)), verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, maskfit.MaskedModel)
    np.testing.assert_array_equal(
        loaded.predict(np.ones((2, 4)), verbose=0),
        model.predict(np.ones((2, 4)), verbose=0),
    )
    loaded.fit(np.ones((4, 4)), np.ones((4, 3)), verbose=0)
