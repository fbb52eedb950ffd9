"""Fixtures for tests of TensorFlow functions alone, in eager, graph and jit.

A module takes them up by name (`_fresh_keras = tf_modes._fresh_keras`,
`mode_name = tf_modes.mode_name`): pytest finds fixtures among its names.
"""

import pytest


@pytest.fixture(autouse=True)
def _fresh_keras():
    """Overrides conftest's: these tests make no Keras state, and its
    clear_session (a gc.collect) costs ~0.3 s per test."""
    yield


@pytest.fixture(params=["eager", "graph", "jit"])
def mode_name(request):
    """How the function under test runs: eagerly, in a tf.function, or XLA-compiled."""
    return request.param
