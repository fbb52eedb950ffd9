"""The JAX backend's tests: run with `KERAS_BACKEND=jax python -m pytest tests/jax`.

Keras fixes its backend when it is first imported, so these tests run in a
pytest process of their own; under any other backend they are not collected
(the TensorFlow suite, `python -m pytest tests`, skips this folder).
`backend_mode` gives the two ways Keras's JAX trainer runs a step: compiled
(`jit_compile=True`) and eagerly (`run_eagerly=True`).
"""

import keras
import pytest

if keras.backend.backend() != "jax":
    collect_ignore_glob = ["test_*.py"]

MODES = {"eager": dict(run_eagerly=True), "jit": dict(jit_compile=True)}


@pytest.fixture(params=sorted(MODES))
def backend_mode(request):
    """Compile kwargs for the JAX trainer's two ways of running a step."""
    return dict(MODES[request.param])
