"""A `.keras` file saved with masks on TensorFlow loads and trains on under JAX, and back.

Three legs (tests/backend_roundtrip.py): TensorFlow builds, trains and saves
(a subprocess); this process, on JAX, loads the file, checks that masks,
weights, the optimizer's state, `maskfit.summary`, `evaluate` and `predict`
are those of the file, trains on (frozen entries bit-identical, the rest
learning, a `PiecewiseMask` switching inside the compiled step) and saves;
TensorFlow loads that file and does the same checks (a subprocess).
"""

import os
import subprocess
import sys

import backend_roundtrip
import keras
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax", reason="the JAX leg runs in this process"
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "backend_roundtrip.py")


def _tensorflow_leg(*args):
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        PYTHONPATH=path,
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    result = subprocess.run(
        [sys.executable, SCRIPT, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert f"{args[0]}: ok under tensorflow" in result.stdout


def test_masks_hold_from_tensorflow_to_jax_and_back(tmp_path):
    tensorflow_dir, jax_dir = str(tmp_path / "tf"), str(tmp_path / "jax")
    _tensorflow_leg("new", tensorflow_dir)
    model = keras.saving.load_model(os.path.join(tensorflow_dir, "model.keras"))
    backend_roundtrip.check_leg(model, tensorflow_dir)
    backend_roundtrip.write_leg(model, jax_dir)
    _tensorflow_leg("resume", jax_dir, str(tmp_path / "back"))
