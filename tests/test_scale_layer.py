"""Tests for maskfit.layers.Scale."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from maskfit.layers import Scale

pytestmark = pytest.mark.backends("tensorflow", "jax")

COMPILE_MODES = {
    "eager": dict(run_eagerly=True),
    "graph": dict(jit_compile=False),
    "jit": dict(jit_compile=True),
}
if keras.backend.backend() == "jax":
    del COMPILE_MODES["graph"]  # JAX compiles a step that is not eager with jit


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def seed_model(**scale_kwargs):
    """The seed's model: y = scale * x with a (1,) scale starting at 2."""
    inputs = keras.Input((1,))
    layer = Scale(
        shape=(1,), initializer=keras.initializers.Constant(2.0), **scale_kwargs
    )
    return keras.Model(inputs, layer(inputs)), layer


def fit_seed(model, mode):
    x = np.full((64, 1), 2.0, "float32")
    y = np.full((64, 1), 5.0, "float32")
    model.compile(
        loss="mse", optimizer=keras.optimizers.SGD(0.05), **COMPILE_MODES[mode]
    )
    model.fit(x, y, batch_size=16, epochs=5, verbose=0)


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_seed_example_learns_2_5(mode):
    model, layer = seed_model()
    fit_seed(model, mode)
    assert tuple(layer.scale.shape) == (1,)
    np.testing.assert_allclose(layer.scale.numpy(), [2.5], atol=1e-3)


@pytest.mark.parametrize(
    "mode",
    ["jit", pytest.param("eager", marks=pytest.mark.slow)]  # 7 s eagerly on JAX
    if keras.backend.backend() == "jax"
    else ["eager", "jit"],
)
def test_seed_example_under_mixed_float16(mixed_float16, mode):
    model, layer = seed_model()
    assert layer.scale.dtype == "float32"
    assert model(np.ones((2, 1), "float32")).dtype == "float16"
    fit_seed(model, mode)
    np.testing.assert_allclose(layer.scale.numpy(), [2.5], atol=1e-2)


@pytest.mark.parametrize(
    "shape, want_shape, axes",
    [
        (None, (3,), (0, 1)),  # per feature
        ((), (), (0, 1, 2)),  # scalar
        ((2, 1), (2, 1), (0, 2)),  # broadcast inside the example
    ],
)
def test_gradient_is_summed_per_example_term(shape, want_shape, axes):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 2, 3)).astype("float32")
    weights = rng.normal(size=(4, 2, 3)).astype("float32")
    layer = Scale(shape=shape, initializer="ones")
    layer.build(x.shape)
    if keras.backend.backend() == "jax":
        import jax

        def loss(scale):
            y, _ = layer.stateless_call([scale], [], x)
            return keras.ops.sum(y * weights)

        got = jax.grad(loss)(layer.scale.value)
    else:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x) * weights)
        got = tape.gradient(loss, layer.scale)
    assert tuple(got.shape) == want_shape
    want = np.reshape((x * weights).sum(axes), want_shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_forward_multiplies_by_scale():
    layer = Scale(initializer=keras.initializers.Constant(3.0))
    np.testing.assert_array_equal(
        layer(np.ones((2, 4), "float32")), np.full((2, 4), 3.0)
    )


def test_config_round_trip():
    layer = Scale(
        shape=(1, 3),
        initializer=keras.initializers.Constant(0.5),
        constraint="non_neg",
        regularizer=keras.regularizers.L2(0.1),
        name="s",
    )
    config = layer.get_config()
    assert config["shape"] == [1, 3]
    clone = Scale.from_config(config)
    assert clone.get_config() == config
    clone.build((None, 2, 3))
    assert tuple(clone.scale.shape) == (1, 3)
    np.testing.assert_array_equal(clone.scale.numpy(), np.full((1, 3), 0.5))
    assert isinstance(clone.constraint, keras.constraints.NonNeg)
    # Keras 3.14 keeps l2 as a float32 tensor: its config reads 0.10000000149...
    assert clone.regularizer.get_config() == {"l2": pytest.approx(0.1, rel=1e-7)}


def test_save_and_load_without_custom_objects(tmp_path):
    inputs = keras.Input((3,))
    layer = Scale(
        regularizer="l2",
        constraint="non_neg",
        name="sc",
        initializer=keras.initializers.Constant([1.0, 2.0, 3.0]),
    )
    model = keras.Model(inputs, layer(inputs))
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_layer = loaded.get_layer("sc")
    assert type(loaded_layer) is Scale
    assert loaded_layer.get_config() == layer.get_config()
    np.testing.assert_array_equal(loaded_layer.scale.numpy(), [1.0, 2.0, 3.0])
    x = np.random.default_rng(0).normal(size=(5, 3)).astype("float32")
    np.testing.assert_array_equal(loaded(x), model(x))


def test_regularizer_adds_a_loss():
    layer = Scale(regularizer=keras.regularizers.L2(0.5))
    layer(np.ones((1, 2), "float32"))
    np.testing.assert_allclose(sum(layer.losses), 0.5 * 2)


@pytest.mark.parametrize("shape", ["3", 3, (0,), (2.0,), (True,), (-1, 2)])
def test_bad_shape_is_rejected_in_constructor(shape):
    with pytest.raises(ValueError, match=r"invalid value for `shape`.*Received"):
        Scale(shape=shape)


def test_shape_that_changes_the_input_is_rejected_at_build():
    with pytest.raises(ValueError, match=r"Layer 'bad'.*shape=\(4,\)"):
        Scale(shape=(4,), name="bad").build((None, 3))
    with pytest.raises(ValueError, match=r"Layer 'bad2'.*\(None, 3\)"):
        Scale(shape=(2, 3), name="bad2").build((None, 3))


def test_unknown_last_axis_needs_explicit_shape():
    with pytest.raises(ValueError, match=r"Layer 'feat'.*shape=\(\)"):
        Scale(name="feat").build((None, None))
