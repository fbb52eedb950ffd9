"""ActivationImportance: the norms it records, the units it ranks low (Wanda's and
Minitron's scores, checked against numpy), dense, convolution and attention
layers, nested layers, pruning in fit in every mode, its config, its errors."""

import keras
import numpy as np
import pytest

import maskfit

pruning = maskfit.pruning
L = keras.layers


def mlp():
    inputs = keras.Input((5,))
    hidden = L.Dense(8, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, L.Dense(3, name="head")(hidden))


def calibration(count=40, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(count, 5)) * [0.5, 1, 2, 3, 4]).astype("float32")


def test_norms_are_the_input_norms_of_each_layer():
    model = mlp()
    x = calibration()
    importance = pruning.ActivationImportance().calibrate(model, x, batch_size=7)
    hidden = np.maximum(x @ model.get_layer("hidden").kernel.numpy(), 0) + 0.0
    hidden = np.maximum(
        x @ model.get_layer("hidden").kernel.numpy()
        + model.get_layer("hidden").bias.numpy(),
        0,
    )
    np.testing.assert_allclose(
        importance.norms["hidden/kernel"][:, 0], np.linalg.norm(x, axis=0), rtol=1e-5
    )
    np.testing.assert_allclose(
        importance.norms["head/kernel"][:, 0],
        np.linalg.norm(hidden, axis=0),
        rtol=1e-5,
    )
    assert importance.norms["hidden/kernel"].shape == (5, 1)


@pytest.mark.parametrize("weighted", [True, False])
def test_ranks_units_as_wanda_and_output_norms_do(weighted):
    model = mlp()
    x = calibration()
    w1 = model.get_layer("hidden").kernel.numpy()
    w2 = model.get_layer("head").kernel.numpy()
    h = np.maximum(x @ w1 + model.get_layer("hidden").bias.numpy(), 0)
    x_norm, h_norm = np.linalg.norm(x, axis=0), np.linalg.norm(h, axis=0)
    if weighted:  # Wanda: |w| * the norm of the input it multiplies, over the group
        score = (np.abs(w1) * x_norm[:, None]).sum(0) + (
            np.abs(w2) * h_norm[:, None]
        ).sum(1)
    else:  # the unit's output norm (the producer's share is the same for all)
        score = h_norm + x_norm.sum() / 8
    importance = pruning.ActivationImportance(weighted=weighted).calibrate(model, x)
    removed = pruning.select_units(model, 0.5, importance=importance).removed()
    assert removed == {"hidden": {"units": sorted(np.argsort(score)[:4].tolist())}}


def test_convolution_kernels_use_their_input_channels():
    inputs = keras.Input((6, 6, 3))
    h = L.Conv2D(4, 3, padding="same", name="conv")(inputs)
    h = L.Conv2D(5, 3, padding="same", name="conv2")(h)
    model = keras.Model(inputs, L.Dense(2)(L.GlobalAveragePooling2D()(h)))
    x = np.random.default_rng(1).normal(size=(10, 6, 6, 3)).astype("float32")
    importance = pruning.ActivationImportance().calibrate(model, x)
    assert importance.norms["conv/kernel"].shape == (1, 1, 3, 1)
    np.testing.assert_allclose(
        importance.norms["conv/kernel"].ravel(),
        np.linalg.norm(x.reshape(-1, 3), axis=0),
        rtol=1e-5,
    )
    kept = pruning.shrink(
        model, pruning.select_units(model, 0.5, importance=importance)
    )
    assert kept.get_layer("conv").filters == 2


def test_attention_heads_are_ranked_by_their_output_norm():
    inputs = keras.Input((4, 8))
    attention = L.MultiHeadAttention(num_heads=4, key_dim=3, name="attention")
    model = keras.Model(inputs, attention(inputs, inputs))
    x = np.random.default_rng(2).normal(size=(6, 4, 8)).astype("float32")
    # Head 1's values are scaled up: its output norm is the largest.
    value = attention._value_dense.kernel
    scaled = value.numpy()
    scaled[:, 1] *= 10.0
    scaled[:, 3] *= 0.01
    value.assign(scaled)
    importance = pruning.ActivationImportance(weighted=False).calibrate(model, x)
    assert importance.norms["attention/attention_output/kernel"].shape == (4, 3, 1)
    removed = pruning.select_units(model, 0.25, importance=importance).removed()
    assert removed["attention"]["heads"] == [3]
    small = pruning.shrink(
        model, pruning.select_units(model, 0.5, importance=importance)
    )
    assert small.get_layer("attention").num_heads == 2


@pytest.mark.backends("tensorflow", "jax")
def test_prunes_in_fit_the_units_select_units_chooses(mode):
    x = calibration(32)
    y = np.random.default_rng(3).normal(size=(32, 3)).astype("float32")
    model = mlp()
    importance = pruning.ActivationImportance().calibrate(model, x)
    expected = pruning.select_units(model, 0.5, importance=importance).removed()
    pruned = pruning.prune_units(
        model,
        pruning.ConstantSparsity(0.5, begin_step=1, end_step=1),
        importance=importance,
    )
    pruned.compile(optimizer="adam", loss="mse", **mode)
    pruned.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert pruning.unit_selection(pruned).removed() == expected
    kernel = pruned.get_layer("hidden").kernel.numpy()
    np.testing.assert_array_equal(
        kernel[:, expected["hidden"]["units"]],
        np.zeros((5, 4), np.float32),
    )


def test_config_round_trip_keeps_the_norms():
    importance = pruning.ActivationImportance(weighted=False).calibrate(
        mlp(), calibration()
    )
    again = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(importance)
    )
    assert again == importance
    assert again.weighted is False
    np.testing.assert_array_equal(
        again.norms["head/kernel"], importance.norms["head/kernel"]
    )
    assert "norms=<2 variables>" in repr(importance)


def test_errors_name_what_is_wrong():
    model = mlp()
    with pytest.raises(ValueError, match="no norms yet"):
        pruning.select_units(model, 0.5, importance=pruning.ActivationImportance())
    with pytest.raises(TypeError, match="weighted must be True or False"):
        pruning.ActivationImportance(weighted=1)
    with pytest.raises(ValueError, match="at least one example"):
        pruning.ActivationImportance().calibrate(model, np.zeros((0, 5), "float32"))
    importance = pruning.ActivationImportance().calibrate(model, calibration())
    keras.backend.clear_session()
    inputs = keras.Input((5,))
    hidden = L.Dense(6, name="hidden")(inputs)
    other = keras.Model(inputs, L.Dense(3, name="head")(hidden))
    with pytest.raises(ValueError, match="'head/kernel' has shape"):
        pruning.select_units(other, 0.5, importance=importance)
    embedding_only = keras.Sequential(
        [keras.Input((3,), dtype="int32"), L.Embedding(9, 2)]
    )
    with pytest.raises(ValueError, match="saw no input"):
        pruning.ActivationImportance().calibrate(
            embedding_only, np.zeros((2, 3), "int32")
        )


def test_calibration_leaves_the_layers_as_they_were():
    model = mlp()
    x = calibration()
    before = model.predict(x, verbose=0)
    pruning.ActivationImportance().calibrate(model, x)
    assert not any("call" in vars(layer) for layer in model.layers)
    np.testing.assert_array_equal(model.predict(x, verbose=0), before)
