"""Pruning's pieces on JAX and torch: one-shot unit selection and `shrink`,
a model pruned on TensorFlow loaded, evaluated, trained on and stripped
on JAX or torch, and one pruned there loaded likewise on TensorFlow (magnitude
pruning in `fit`: test_magnitude_in_fit.py). Under torch the two round trips
(a TensorFlow subprocess each, ~12 s) are `slow`.
"""

import keras
import numpy as np
import pytest

import maskfit.pruning as pruning
from tests.helpers import backend_roundtrip

pytestmark = pytest.mark.backends("jax", "torch")


def _slow_on_torch(test):
    """A TensorFlow subprocess costs ~12 s: the torch fast suite leaves it out."""
    return pytest.mark.slow(test) if keras.backend.backend() == "torch" else test


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


@_slow_on_torch
def test_a_model_pruned_here_loads_evaluates_strips_and_trains_on_tensorflow(
    tmp_path,
):
    out = str(tmp_path / "pruned")
    backend_roundtrip.pruned(out)  # prune_low_magnitude in fit, here on JAX or torch
    backend_roundtrip.run_on_tensorflow("load_pruned", out)


@_slow_on_torch
def test_a_model_pruned_on_tensorflow_evaluates_strips_and_trains_here(tmp_path):
    out = str(tmp_path / "pruned")
    backend_roundtrip.run_on_tensorflow("pruned", out)
    backend_roundtrip.check_pruned(out)
