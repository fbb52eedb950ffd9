"""Files saved by maskfit 0.1.0 and 0.2.0 load to the state they were saved in, and train on.

0.1.0 keyed keep masks and optimizer variables by position; 0.2.0's rules and
importances name modules that 0.3.0 moved (`maskfit.moved`).
"""

import importlib.util
import os

import keras
import numpy as np
import pytest

import maskfit
from maskfit import model as model_lib
from maskfit.spec import rules as spec_rules
from tests.helpers.keras_versions import KERAS

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
HERE = os.path.join(DATA, "maskfit_0_1_0")


def _expected(path=None):
    with np.load(path or os.path.join(HERE, "expected.npz")) as data:
        return {key: data[key] for key in data.files}  # in the order saved


def _builder():
    spec = importlib.util.spec_from_file_location(
        "make_files", os.path.join(HERE, "make_files.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def _check_weights(model, expected):
    for variable in model.weights:
        np.testing.assert_array_equal(
            variable.numpy(), expected[f"weight:{variable.path}"], err_msg=variable.path
        )
    # In the optimizer's order: their paths differ between Keras releases
    # ('adam_w/...' in 3.15, 'adamw/...' in 3.10).
    saved = [v for k, v in expected.items() if k.startswith("optimizer:")]
    loaded = [v.numpy() for v in model.optimizer.variables]
    assert len(loaded) == len(saved)
    for path, got, value in zip(expected, loaded, saved):
        np.testing.assert_array_equal(got, value, err_msg=path)
    np.testing.assert_allclose(
        model.predict(expected["x"], verbose=0),
        expected["prediction"],
        rtol=1e-5,
        atol=1e-6,
    )


def _check_state(model, expected):
    _check_weights(model, expected)
    variables = model_lib.all_trainable_variables(model)
    keeps = {variables[i].path: k for i, k in model_lib.keep_masks(model).items()}
    saved_keeps = {
        k[len("keep:") :]: v for k, v in expected.items() if k.startswith("keep:")
    }
    assert sorted(keeps) == sorted(saved_keeps)
    for path, keep in saved_keeps.items():
        np.testing.assert_array_equal(keeps[path], keep, err_msg=path)


def _trains_on(model, expected):
    middle = model.get_layer("middle")
    frozen = middle.kernel.numpy()
    model.fit(
        expected["x"], expected["y"], batch_size=4, epochs=1, shuffle=False, verbose=0
    )
    np.testing.assert_array_equal(middle.kernel.numpy(), frozen)
    variables = model_lib.all_trainable_variables(model)
    for index, keep in model_lib.keep_masks(model).items():
        assert np.all(variables[index].numpy()[~keep] == 0)


_WRITTEN_BY_3_15 = pytest.mark.skipif(
    KERAS < (3, 15),
    reason="the .keras files were written by Keras 3.15, whose Dense config"
    " (quantization_config) older Keras releases cannot read",
)


@_WRITTEN_BY_3_15
def test_a_saved_model_loads_with_its_masks_rules_and_optimizer_state():
    expected = _expected()
    model = keras.saving.load_model(os.path.join(HERE, "model.keras"))
    assert isinstance(model, maskfit.MaskedModel)
    assert isinstance(maskfit.get_mask(model.get_layer("head")), maskfit.PiecewiseMask)
    _check_state(model, expected)
    _trains_on(model, expected)


def test_saved_weights_load_into_a_model_built_anew():
    expected = _expected()
    keras.utils.set_random_seed(123)
    model = _builder()()
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1), loss="mse")
    model.load_weights(os.path.join(HERE, "model.weights.h5"))
    _check_state(model, expected)
    _trains_on(model, expected)


@pytest.mark.parametrize("name", ["model.keras", "model.weights.h5"])
def test_the_files_hold_position_keyed_entries(name):
    # What this file guards: 0.1.0 keyed keep masks and the optimizer's
    # variables by position; later releases must keep reading them.
    import zipfile

    import h5py

    path = os.path.join(HERE, name)
    if name.endswith(".keras"):
        with zipfile.ZipFile(path) as archive:
            with archive.open("model.weights.h5") as f:
                data = f.read()
        import io

        handle = h5py.File(io.BytesIO(data), "r")
    else:
        handle = h5py.File(path, "r")
    with handle:
        keys = sorted(handle["vars"].keys())
    assert keys == ["maskfit_keep_0", "maskfit_keep_4", "maskfit_optimizer_variables"]


def _load_0_2_0(name):
    folder = os.path.join(DATA, "maskfit_0_2_0")
    expected = _expected(os.path.join(folder, f"{name}.npz"))
    model = keras.saving.load_model(os.path.join(folder, f"{name}.keras"))
    assert isinstance(model, maskfit.MaskedModel)
    _check_weights(model, expected)
    return model, expected


def _fit(model, expected):
    model.fit(
        expected["x"], expected["y"], batch_size=4, epochs=1, shuffle=False, verbose=0
    )


@_WRITTEN_BY_3_15
def test_units_pruned_in_fit_load_with_their_rule_and_stay_pruned():
    model, expected = _load_0_2_0("units")
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


@_WRITTEN_BY_3_15
def test_a_rigl_model_loads_with_its_rule_and_keeps_its_sparsity():
    model, expected = _load_0_2_0("sparse")
    rules = [rule for _, rule in spec_rules.layer_rules(model)]
    assert any(isinstance(rule, maskfit.sparse.RigL) for rule in rules)
    kernel = model.get_layer("middle").kernel
    zeros = kernel.numpy() == 0
    assert zeros.mean() >= 0.25
    _fit(model, expected)  # past t_end: the connections stay where they are
    np.testing.assert_array_equal(kernel.numpy() == 0, zeros)
