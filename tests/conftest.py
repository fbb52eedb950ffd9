"""Shared test set-up: quiet TensorFlow, the backend's tests, the modes, fresh seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

from maskfit.step import masker as masker_lib  # noqa: E402

# The three ways Keras runs a step; tests that promise exactness run in all.
# Under JAX, Keras compiles a step that is not run eagerly with jax.jit either
# way, so "graph" would repeat "jit": a `mode` test there runs eager and jit.
# Under torch, a step that is not run eagerly is still eager unless
# `jit_compile=True` (torch.compile), so "graph" would repeat "eager".
MODES = {
    "eager": dict(run_eagerly=True),
    "graph": dict(),
    "jit": dict(jit_compile=True),
}
# A graph-mode step whose masked update is compiled with XLA. maskfit does that
# only for large variables (masker.FUSE_MIN_ENTRIES), which no test model has:
# a test marked `fused_too` (or a module with `pytestmark = pytest.mark.fused_too`)
# also runs with `mode` set this way.
FUSED = "graph_fused"

# The Keras backend under test, fixed when Keras is imported (KERAS_BACKEND):
# each backend is its own pytest invocation. A test runs under the backends
# its `backends` marker names (`pytestmark = pytest.mark.backends("tensorflow",
# "jax")` for a module, or on one test; "torch" for Keras's PyTorch backend),
# under TensorFlow alone when it has none; under any other backend it is
# deselected (and counted so).
BACKEND = keras.backend.backend()
DEFAULT_BACKENDS = ("tensorflow",)


def backends_of(node):
    """The backends a collected test (or its module or class) runs under."""
    marker = node.get_closest_marker("backends")
    return tuple(marker.args) if marker is not None else DEFAULT_BACKENDS


def pytest_collection_modifyitems(config, items):
    kept, deselected = [], []
    for item in items:
        (kept if BACKEND in backends_of(item) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "backends(*names): the Keras backends the test runs under (default: tensorflow)",
    )
    config.addinivalue_line(
        "markers",
        "fused_too: also run the `mode` test in graph mode with a fused update",
    )
    config.addinivalue_line(
        "markers",
        "other_modes_slow: under TensorFlow the `mode` test's eager and jit cases are"
        " `slow` (a matrix over optimizers or layers whose promise in those modes a"
        " fast test keeps); JAX's two modes both stay fast",
    )
    config.addinivalue_line(
        "markers",
        "slow: a long end-to-end run (an experiment or benchmark at a realistic size,"
        " worker processes); README's test command leaves these out, .ci/run runs them",
    )
    config.addinivalue_line(
        "markers",
        "sweep: the whole keras.applications sweep (slow too; about 13 minutes of"
        " CPU; .ci/run runs it with `-n 2 --dist load -m sweep`)",
    )


def _parametrized_directly(metafunc, name):
    """Whether the test's own `parametrize` marks give argument `name`."""
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        if isinstance(names, str):
            names = [part.strip() for part in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc):
    if "mode" in metafunc.fixturenames and not _parametrized_directly(metafunc, "mode"):
        names = sorted(MODES)
        if BACKEND in ("jax", "torch"):
            # JAX compiles a step that is not run eagerly either way; Keras's
            # torch trainer runs it eagerly unless `jit_compile=True`.
            names.remove("graph")
        if (
            BACKEND == "tensorflow"
            and metafunc.definition.get_closest_marker("other_modes_slow") is not None
        ):
            names = [
                name if name == "graph" else pytest.param(name, marks=pytest.mark.slow)
                for name in names
            ]
        if BACKEND == "torch":
            # torch.compile takes minutes per model here (a jit test of the
            # exactness matrix: 3 minutes on 2 cores): slow, all of them.
            names = [
                pytest.param(name, marks=pytest.mark.slow) if name == "jit" else name
                for name in names
            ]
        if (
            BACKEND == "tensorflow"
            and metafunc.definition.get_closest_marker("fused_too") is not None
        ):
            # The fused variant repeats graph mode with XLA in the update: slow.
            names.append(pytest.param(FUSED, marks=pytest.mark.slow))
        metafunc.parametrize("mode", names, indirect=True)


@pytest.fixture
def mode(request, monkeypatch):
    """Compile kwargs for eager, graph and jit execution (and graph, fused)."""
    if request.param == FUSED:
        monkeypatch.setattr(masker_lib, "FUSE_MIN_ENTRIES", 0)
        return dict(MODES["graph"])
    return MODES[request.param]


@pytest.fixture(autouse=True)
def _fresh_keras():
    # Fresh names and global state; no forced gc.collect (about 0.3 s a test
    # once TensorFlow has traced functions: minutes over the suite), Python's
    # own collector still runs.
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
