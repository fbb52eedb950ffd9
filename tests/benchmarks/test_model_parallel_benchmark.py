"""`benchmarks.model_parallel`, run tiny: its rows, files and bytes per device.

JAX fixes its devices at start, so the benchmark runs as `python -m` in a
process of its own, which splits the CPU into 8 devices (its `__main__`).
"""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.model_parallel import lib
from tests.helpers import benchmark_checks, checkout

pytestmark = [pytest.mark.backends("tensorflow", "jax"), pytest.mark.slow]

_TINY = [
    "--mlp_width=64",
    "--mlp_batch=16",
    "--llama_hidden=32",
    "--llama_heads=4",
    "--llama_intermediate=64",
    "--llama_vocabulary=64",
    "--llama_sequence=8",
    "--llama_batch=4",
    *(f"--{k}={v}" for k, v in benchmark_checks.TINY_TIMING.items()),
]


def test_run_times_each_contender_and_reports_sharded_mask_bytes(tmp_path):
    workdir = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.model_parallel", f"--workdir={workdir}"]
        + _TINY,
        env=checkout.env(TF_CPP_MIN_LOG_LEVEL="2"),
        cwd=checkout.ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    with open(os.path.join(workdir, "model_parallel.json")) as f:
        rows = json.load(f)["rows"]
    found = benchmark_checks.written(workdir, "model_parallel", rows, lib.COLUMNS)
    assert found["machine"]["devices"] == 8 and found["machine"]["mesh"] == "2x4"
    assert [(r["model"], r["mask"]) for r in rows] == [
        (model, mask)
        for model in ("mlp", "llama")
        for mask in ("none", "output", "element")
    ]
    benchmark_checks.assert_timed_against_none(rows)
    for row in rows:
        if row["mask"] == "element":
            # Booleans beside float32 shards: a quarter on the busiest device
            # (the whole mask, replicated, would be 4 or 8 times that).
            assert row["mask_ratio"] == pytest.approx(0.25, abs=0.01)
        elif row["mask"] == "none":
            assert row["mask_bytes"] is None
    assert len(lib.format_table(rows).splitlines()) == len(rows) + 1


def test_too_few_devices_is_one_clear_error(tmp_path):
    import keras

    if keras.backend.backend() != "jax":
        with pytest.raises(RuntimeError, match="measures Keras's JAX backend"):
            lib.run(lib.Config(), str(tmp_path))
        return
    with pytest.raises(RuntimeError, match="needs 8 devices for a 2x4 mesh"):
        lib.run(lib.Config(), str(tmp_path))
    assert not os.listdir(tmp_path)  # nothing written
