"""Files saved by maskfit 0.1.0 load to the state they were saved in, and train on."""

import importlib.util
import os

import keras
import numpy as np
import pytest

import maskfit
from maskfit import model as model_lib
from tests.helpers.keras_versions import KERAS

HERE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "maskfit_0_1_0"
)


def _expected():
    with np.load(os.path.join(HERE, "expected.npz")) as data:
        return {key: data[key] for key in data.files}  # in the order saved


def _builder():
    spec = importlib.util.spec_from_file_location(
        "make_files", os.path.join(HERE, "make_files.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def _check_state(model, expected):
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


@pytest.mark.skipif(
    KERAS < (3, 15),
    reason="the .keras file was written by Keras 3.15, whose Dense config"
    " (quantization_config) older Keras releases cannot read",
)
def test_a_saved_model_loads_with_its_masks_rules_and_optimizer_state():
    expected = _expected()
    model = keras.saving.load_model(os.path.join(HERE, "model.keras"))
    assert isinstance(model, maskfit.MaskedModel)
    assert isinstance(maskfit.get_mask(model.get_layer("head")), maskfit.PiecewiseMask)
    _check_state(model, expected)
    np.testing.assert_allclose(
        model.predict(expected["x"], verbose=0),
        expected["prediction"],
        rtol=1e-5,
        atol=1e-6,
    )
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
