"""Shared test set-up: quiet TensorFlow, the three execution modes, fresh seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

# The three ways Keras runs a step; tests that promise exactness run in all.
MODES = {
    "eager": dict(run_eagerly=True),
    "graph": dict(),
    "jit": dict(jit_compile=True),
}


@pytest.fixture(params=sorted(MODES))
def mode(request):
    """Compile kwargs for eager, graph and jit execution."""
    return MODES[request.param]


@pytest.fixture(autouse=True)
def _fresh_keras():
    keras.backend.clear_session()
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
