"""Smoke test of the step-time benchmark: it runs tiny and writes its table."""

import dataclasses
import json
import os

import pytest

from benchmarks import hlo
from benchmarks.step_time import lib as harness
from tests.helpers import benchmark_checks

# Graph mode only: jit compiles each of the 12 contenders again and doubles
# the test's time; the mode is one compile() argument in the harness.
_TINY = harness.Config(
    modes=("graph",),
    mlp_depth=2,
    mlp_width=16,
    mlp_batch=8,
    cnn_filters=(4, 8),
    cnn_image=8,
    cnn_batch=4,
    **benchmark_checks.TINY_TIMING,
)


# A whole tiny run of the benchmark (10-25 s): slow, so README's suite stays
# under 10 minutes; CI runs it.
@pytest.mark.slow
def test_run_writes_one_row_per_contender(tmp_path):
    workdir = str(tmp_path)
    rows = harness.run(_TINY, workdir)

    expected = {
        (model, mode, optimizer, mask)
        for model in _TINY.models
        for mode in _TINY.modes
        for optimizer in _TINY.optimizers
        for mask in _TINY.masks
    }
    keys = [(r["model"], r["mode"], r["optimizer"], r["mask"]) for r in rows]
    assert sorted(keys) == sorted(expected)
    written = benchmark_checks.written(workdir, "step_time", rows, harness.COLUMNS)
    assert written["machine"]["cores"] >= 1
    assert len(rows) == len(expected)
    assert os.path.exists(os.path.join(workdir, "config.json"))
    benchmark_checks.assert_timed_against_none(rows)
    for row in rows:
        if row["mask"] == "none":
            assert row["mask_state_bytes"] == row["snapshot_bytes"] == 0
        else:
            assert 0 < row["mask_state_bytes"] <= row["param_bytes"]
        if row["mask"] == "output":
            # O(units): one value per unit for each kernel and bias.
            assert row["mask_state_bytes"] < row["param_bytes"] / 2
        # Graph mode is not compiled with XLA: no HLO figures.
        assert all(row[key] is None for key in hlo.COLUMNS)
        if row["optimizer"] == "sgd":
            assert row["snapshot_bytes"] == 0
        elif row["mask"] != "none":
            assert row["snapshot_bytes"] > 0


def test_format_table_has_a_line_per_row(tmp_path):
    rows = [
        dict(
            model="mlp",
            mode="graph",
            optimizer="sgd",
            mask="none",
            step_ms=1.0,
            ratio_median=1.0,
            ratio_min=1.0,
            ratio_max=1.0,
            cpu_ratio_median=1.0,
            param_bytes=4,
            mask_state_bytes=0,
            snapshot_bytes=0,
            **dict.fromkeys(hlo.COLUMNS),
        )
    ]
    assert len(harness.format_table(rows).splitlines()) == 2


def test_untimed_run_reports_the_compiled_steps_hlo(tmp_path):
    config = dataclasses.replace(
        _TINY,
        models=("mlp",),
        modes=("jit",),
        optimizers=("adamw",),
        masks=("none", "element"),
        timing=False,
    )
    rows = harness.run(config, str(tmp_path))

    benchmark_checks.assert_untimed_with_hlo(rows, harness.format_table(rows))


def test_seed_scenarios_run_tiny_and_agree_with_the_seeds():
    from benchmarks.seed_scenarios import runs as seed_scenarios

    seed_seconds, seed_scale = seed_scenarios.seed_learnable_scale(samples=4000)
    ours_seconds, ours_scale = seed_scenarios.ours_learnable_scale(1, samples=4000)
    assert seed_seconds > 0 and ours_seconds > 0
    # The same SGD steps on the same batches: the same learned scale.
    assert abs(ours_scale - seed_scale) < 1e-5 and 2.0 < ours_scale <= 2.5
    assert seed_scenarios.seed_manual(3) > 0 and seed_scenarios.seed_tape(3) > 0
    end_to_end, per_step = seed_scenarios.ours("fit", 3, 1)
    assert end_to_end > per_step > 0


@pytest.mark.slow
def test_freezing_benchmark_runs_tiny_and_writes_its_tables(tmp_path):
    from benchmarks.freezing import lib as freezing_lib

    config = freezing_lib.Config(
        depth=2,
        width=8,
        batch=4,
        frozen_layers=1,
        steps_per_execution=2,
        steps=2,
        warmup_steps=2,
        repeats=1,
        memory_width=8,
        memory_steps=2,
        # Each memory run is a process of its own: two show the path.
        memory_contenders=("trainable_false", "output_zeros"),
    )
    results = freezing_lib.run(config, str(tmp_path))
    assert set(results["time"]) == set(freezing_lib.CONTENDERS)
    assert set(results["memory"]) == {"trainable_false", "output_zeros"}
    assert all(grown >= 0 for grown in results["memory"].values())
    for name, row in results["time"].items():
        assert row["step_ms"] > 0
        if name == row["baseline"]:
            assert row["ratio"] == 1.0
    with open(os.path.join(tmp_path, "freezing.json")) as f:
        assert json.load(f)["time"] == results["time"]
    table = (tmp_path / "freezing.md").read_text().splitlines()
    assert len(table) == 2 + len(freezing_lib.CONTENDERS) + len(freezing_lib.PARTIAL)


# A whole tiny run of the benchmark (10-25 s): slow, so README's suite stays
# under 10 minutes; CI runs it.
@pytest.mark.slow
def test_unit_pruning_step_benchmark_runs_tiny(tmp_path):
    from benchmarks.unit_pruning_step import lib

    config = lib.Config(
        widths=(4, 8, 8, 3), batch=4, steps=2, warmup_steps=1, repeats=1, frequency=1
    )
    rows = lib.run(config, str(tmp_path))

    assert [r["contender"] for r in rows] == list(lib.CONTENDERS)
    assert os.path.exists(os.path.join(str(tmp_path), "unit_pruning_step.json"))
