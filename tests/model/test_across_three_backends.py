"""A `.keras` file with masks goes TensorFlow -> torch -> JAX -> TensorFlow, exact.

The legs of tests/helpers/backend_roundtrip.py: TensorFlow builds, trains and
saves (a subprocess); this process, on torch, loads the file, checks that
masks, weights, the optimizer's step and state, `maskfit.summary`, `evaluate`
and `predict` are those of the file, trains on (frozen entries bit-identical,
the rest learning, a `PiecewiseMask` switching at step 6) and saves; JAX
loads that file, checks and trains on the same way and saves (a subprocess);
TensorFlow loads JAX's file and does it once more (a subprocess).
"""

import os

import keras
import pytest

from tests.helpers import backend_roundtrip

pytestmark = pytest.mark.backends("torch")


def test_masks_hold_from_tensorflow_to_torch_to_jax_and_back(tmp_path):
    tensorflow_dir, torch_dir = str(tmp_path / "tf"), str(tmp_path / "torch")
    backend_roundtrip.run_on("tensorflow", "new", tensorflow_dir)
    model = keras.saving.load_model(os.path.join(tensorflow_dir, "model.keras"))
    backend_roundtrip.check_leg(model, tensorflow_dir)
    backend_roundtrip.write_leg(model, torch_dir)
    jax_dir = str(tmp_path / "jax")
    backend_roundtrip.run_on("jax", "resume", torch_dir, jax_dir)
    backend_roundtrip.run_on("tensorflow", "resume", jax_dir, str(tmp_path / "back"))
