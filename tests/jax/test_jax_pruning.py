"""Pruning's pieces that run on JAX: one-shot unit selection and `shrink`,
and a model pruned on TensorFlow loaded, evaluated, trained on and stripped
on JAX (magnitude pruning in `fit` on JAX: test_jax_magnitude_pruning.py).
"""

import json
import os

import backend_roundtrip
import keras
import numpy as np
import pytest

import maskfit
import maskfit.pruning as pruning
from maskfit.spec import rules

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax", reason="pruning's pieces on JAX"
)


def _mlp():
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))


def test_select_units_and_shrink_give_the_pruned_outputs():
    model = _mlp()
    selection = pruning.select_units(model, 0.5)
    removed = selection.removed()["hidden"]["units"]
    assert len(removed) == 4
    small = pruning.shrink(model, selection)
    assert small.get_layer("hidden").units == 4
    assert small.count_params() == model.count_params() - 4 * (5 + 1 + 3)
    # The model with the removed units' weights at 0 computes what the shrunk one does.
    hidden = model.get_layer("hidden")
    kernel, bias = hidden.kernel.numpy(), hidden.bias.numpy()
    kernel[:, removed], bias[removed] = 0.0, 0.0
    hidden.kernel.assign(kernel)
    hidden.bias.assign(bias)
    x = np.random.default_rng(0).normal(size=(16, 5)).astype("float32")
    np.testing.assert_allclose(
        small.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_a_model_pruned_on_tensorflow_evaluates_and_strips_on_jax(tmp_path):
    out = str(tmp_path / "pruned")
    backend_roundtrip.run_on_tensorflow("pruned", out)
    with open(os.path.join(out, "report.json")) as f:
        saved = json.load(f)
    weights = backend_roundtrip.read_npz(os.path.join(out, "leg.npz"))
    model = keras.saving.load_model(os.path.join(out, "model.keras"))
    assert [type(rule).__name__ for _, rule in rules.layer_rules(model)] == [
        "MagnitudePruning"
    ]
    now = backend_roundtrip.report(model)
    assert now["summary"] == saved["summary"]
    assert maskfit.summary(model, print_fn=None).pruned_params > 0
    np.testing.assert_allclose(now["loss"], saved["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        now["predictions"], saved["predictions"], rtol=1e-5, atol=1e-6
    )
    stripped = pruning.strip_pruning(model)
    assert type(stripped) is keras.Sequential
    assert not rules.layer_rules(stripped)
    for variable in stripped.trainable_weights:
        np.testing.assert_array_equal(
            variable.numpy(), weights[backend_roundtrip.layer_key(variable.path)]
        )
    # Trained on under JAX: the rule (50% every step) keeps pruning its kernels.
    x, y = backend_roundtrip.data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    for name in ("hidden", "head"):
        kernel = model.get_layer(name).kernel.numpy()
        assert int(np.count_nonzero(kernel)) == kernel.size // 2
