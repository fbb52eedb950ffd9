"""Files saved by maskfit 0.2.0, whose rules' modules 0.3.0 moved, load and train on."""

import os

import keras
import numpy as np
import pytest

import maskfit
from maskfit.spec import rules as spec_rules
from tests.helpers.keras_versions import KERAS

HERE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "maskfit_0_2_0"
)

pytestmark = pytest.mark.skipif(
    KERAS < (3, 15),
    reason="the .keras files were written by Keras 3.15, whose Dense config"
    " (quantization_config) older Keras releases cannot read",
)


def _load(name):
    with np.load(os.path.join(HERE, f"{name}.npz")) as data:
        expected = {key: data[key] for key in data.files}
    model = keras.saving.load_model(os.path.join(HERE, f"{name}.keras"))
    assert isinstance(model, maskfit.MaskedModel)
    for variable in model.weights:
        np.testing.assert_array_equal(
            variable.numpy(), expected[f"weight:{variable.path}"], err_msg=variable.path
        )
    saved = [v for k, v in expected.items() if k.startswith("optimizer:")]
    loaded = [v.numpy() for v in model.optimizer.variables]
    assert len(loaded) == len(saved)
    for got, value in zip(loaded, saved):
        np.testing.assert_array_equal(got, value)
    np.testing.assert_allclose(
        model.predict(expected["x"], verbose=0),
        expected["prediction"],
        rtol=1e-5,
        atol=1e-6,
    )
    return model, expected


def _fit(model, expected):
    model.fit(
        expected["x"], expected["y"], batch_size=4, epochs=1, shuffle=False, verbose=0
    )


def test_units_pruned_in_fit_load_with_their_rule_and_stay_pruned():
    model, expected = _load("units")
    rules = [rule for _, rule in spec_rules.layer_rules(model)]
    assert any(isinstance(rule, maskfit.structured.UnitPruning) for rule in rules)
    hidden = model.get_layer("hidden").kernel.numpy()
    dropped = np.all(hidden == 0, axis=0)
    assert dropped.any()
    head = model.get_layer("head")
    frozen = head.kernel.numpy()[:, 2]
    _fit(model, expected)
    assert np.all(model.get_layer("hidden").kernel.numpy()[:, dropped] == 0)
    np.testing.assert_array_equal(head.kernel.numpy()[:, 2], frozen)


def test_a_rigl_model_loads_with_its_rule_and_keeps_its_sparsity():
    model, expected = _load("sparse")
    rules = [rule for _, rule in spec_rules.layer_rules(model)]
    assert any(isinstance(rule, maskfit.sparse.RigL) for rule in rules)
    kernel = model.get_layer("middle").kernel
    zeros = kernel.numpy() == 0
    assert zeros.mean() >= 0.25
    _fit(model, expected)  # past t_end: the connections stay where they are
    np.testing.assert_array_equal(kernel.numpy() == 0, zeros)
