"""A `.keras` file saved with masks on TensorFlow loads and trains on under JAX, and back.

Three legs (tests/helpers/backend_roundtrip.py): TensorFlow builds, trains and saves
(a subprocess); this process, on JAX, loads the file, checks that masks,
weights, the optimizer's state, `maskfit.summary`, `evaluate` and `predict`
are those of the file, trains on (frozen entries bit-identical, the rest
learning, a `PiecewiseMask` switching inside the compiled step) and saves;
TensorFlow loads that file and does the same checks (a subprocess).
"""

import os

import keras
import pytest

from tests.helpers import backend_roundtrip

pytestmark = pytest.mark.backends("jax")


def test_masks_hold_from_tensorflow_to_jax_and_back(tmp_path):
    tensorflow_dir, jax_dir = str(tmp_path / "tf"), str(tmp_path / "jax")
    backend_roundtrip.run_on_tensorflow("new", tensorflow_dir)
    model = keras.saving.load_model(os.path.join(tensorflow_dir, "model.keras"))
    backend_roundtrip.check_leg(model, tensorflow_dir)
    backend_roundtrip.write_leg(model, jax_dir)
    backend_roundtrip.run_on_tensorflow("resume", jax_dir, str(tmp_path / "back"))
