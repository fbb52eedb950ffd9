"""Smoke test of `benchmarks.scale`: two tiny Llamas, every phase, its files and fits."""

import json
import math

import numpy as np
import pytest

from benchmarks.scale import lib, measure

pytest.importorskip("keras_hub", reason="needs the hub extra")


def _check_size(result):
    assert list(result["phases"]) == list(measure.PHASES)
    assert all(row["seconds"] > 0 for row in result["phases"].values())
    # Every Dense / EinsumDense kernel got a mask, and the weights file
    # brought every one of them back.
    assert result["masked_kernels"] == result["loaded_masks"] > 0
    assert 0 < result["masked_entries"] < result["params"]
    assert 0 < result["shrunk_params"] < result["params"]
    assert all(v > 0 for v in result["step_seconds"].values())


def test_one_size_measures_every_phase_and_the_pass_alone():
    size = lib._size("tiny", 4)
    _check_size(measure.measure(size))
    alone = measure.structured_pass(size)
    assert alone["seconds"] > 0
    assert 0 < alone["shrunk_weights_bytes"] < alone["weights_bytes"]


@pytest.mark.slow
def test_run_measures_each_size_in_its_own_process_and_fits_exponents(tmp_path):
    config = lib.Config(sizes=("tiny", "tiny2"), sequence=4)
    summary = lib.run(config, str(tmp_path))
    small, large = summary["sizes"]
    assert small["params"] < large["params"]
    for result in (small, large):
        _check_size(result)
        assert result["pass"]["peak_added_bytes"] >= 0
    for phase, fit in summary["exponents"].items():
        assert fit["seconds"] is not None and math.isfinite(fit["seconds"]), phase
    assert set(summary["exponents_per_masked_entry"]) == set(lib.PER_MASKED_ENTRY)
    with open(tmp_path / "scale.json") as f:
        assert json.load(f)["exponents"] == summary["exponents"]
    with open(tmp_path / "scale.md") as f:
        table = f.read()
    assert table == lib.format_table(summary)
    assert all(f"| {phase} |" in table for phase in measure.PHASES)
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_exponents_are_the_log_log_slopes():
    rows = []
    for params, scale in ((1e6, 1.0), (1e8, 100.0)):
        phases = {
            p: {"seconds": scale, "peak_added_bytes": scale**2} for p in measure.PHASES
        }
        rows.append(
            {
                "params": params,
                "phases": phases,
                "step_seconds": {"stock": scale, "masked": 1.0},
            }
        )
    found = lib.exponents(rows)
    np.testing.assert_allclose(found["graph"]["seconds"], 1.0)
    np.testing.assert_allclose(found["graph"]["memory"], 2.0)
    np.testing.assert_allclose(found["step_stock"]["seconds"], 1.0)
    np.testing.assert_allclose(found["step_masked"]["seconds"], 0.0, atol=1e-12)


@pytest.mark.parametrize("sizes", [("tiny",), ("tiny", "huge")])
def test_config_refuses_sizes_it_cannot_fit(sizes):
    with pytest.raises(ValueError, match="at least two of"):
        lib.Config(sizes=sizes)
