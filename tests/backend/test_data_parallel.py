"""Masks hold on every replica under `keras.distribution.DataParallel` (JAX, 2 CPU devices).

JAX fixes its devices at start, so the run is a subprocess with
`XLA_FLAGS=--xla_force_host_platform_device_count=2`
(tests/helpers/data_parallel_run.py); this test reads what it saved.
"""

import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.backends("jax")

from tests.helpers import checkout, data_parallel_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data_parallel") / "run.npz")
    env = checkout.env(
        KERAS_BACKEND="jax",
        TF_CPP_MIN_LOG_LEVEL="2",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    result = subprocess.run(
        [sys.executable, data_parallel_run.__file__, out],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert "data parallel: ok on 2 devices" in result.stdout
    with np.load(out) as saved:
        return {k: saved[k] for k in saved.files}


def _variables(run):
    return sorted(k.split(":", 1)[1] for k in run if k.startswith("frozen:"))


def test_frozen_entries_hold_on_every_replica(run):
    for key in _variables(run):
        frozen = run[f"frozen:{key}"]
        devices = sorted(k for k in run if k.startswith(f"after:{key}:"))
        assert len(devices) == 2, devices
        for name in devices:
            device = name.rsplit(":", 1)[1]
            before, after = run[f"before:{key}:{device}"], run[name]
            np.testing.assert_array_equal(after[frozen], before[frozen], err_msg=name)
            assert np.all(after[~frozen] != before[~frozen]), name


def test_replicas_agree_bit_for_bit(run):
    for key in _variables(run):
        first, second = (
            run[k] for k in sorted(k for k in run if k.startswith(f"after:{key}:"))
        )
        np.testing.assert_array_equal(first, second, err_msg=key)
    assert np.all(np.isfinite(run["losses"]))
