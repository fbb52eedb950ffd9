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


# About a minute of CPU: in the slow tests, which CI runs too.
@pytest.mark.slow
def test_one_size_measures_every_phase_and_the_pass_alone():
    size = lib.size_config("tiny", 4)
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


@pytest.mark.slow
def test_latency_and_the_gpu_table_rehearsed_tiny(tmp_path):
    from benchmarks.scale import gpu_table, latency

    config = latency.Config(size="tiny", tokens=8, batches=(1, 2), repeats=1)
    summary = latency.run(config, str(tmp_path / "latency"))
    assert summary["class"] == "MistralCausalLM"
    assert 0 < summary["shrunk_params"] < summary["params"]
    assert summary["logits_error"] < 1e-5
    assert [(r["dtype"], r["batch"]) for r in summary["rows"]] == [
        (d, b) for d in ("float32", "bfloat16") for b in (1, 2)
    ]
    step = tmp_path / "step_mlp_0"
    step.mkdir()
    mlp = dict(models=["mlp"], mlp_depth=4, mlp_width=4096, mlp_batch=1024)
    (step / "config.json").write_text(json.dumps(mlp))
    rows = [
        dict(model="mlp", mask="none", step_ms=2.0, ratio_median=1.0),
        dict(model="mlp", mask="output", step_ms=2.1, ratio_median=1.05),
        dict(
            model="mlp",
            mask="element",
            step_ms=2.0,
            ratio_median=1.01,
            fusions_ratio=1.0,
            bytes_ratio=1.0433,
        ),
    ]
    (step / "jax_step_time.json").write_text(json.dumps({"rows": rows}))
    text = gpu_table.table(str(tmp_path), "test device")
    assert "| MLP 4x4096 (batch 1024), output | 2 | 1.050 | <= 1.02 NO |" in text
    assert (
        "| MLP 4x4096 (batch 1024), element | 2 | 1.010 | <= 1.04 yes | 1.0000 | 1.0433 |"
        in text
    )
    # A run without the compiled step's figures leaves their cells empty.
    assert "| MLP 4x4096 (batch 1024), output | 2 | 1.050 | <= 1.02 NO |  |  |" in text
    assert text.count("shrunk/dense latency") == 4
    assert "test device" in text


@pytest.mark.parametrize(
    "kwargs", [dict(size="huge"), dict(dtypes=("float16",)), dict(batches=())]
)
def test_latency_config_refuses_what_it_cannot_time(kwargs):
    from benchmarks.scale import latency

    with pytest.raises(ValueError, match="Config"):
        latency.Config(**kwargs)
