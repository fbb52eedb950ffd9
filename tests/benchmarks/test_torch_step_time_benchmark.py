"""`benchmarks.torch_step_time`, run tiny: one row per contender, files written."""

import dataclasses

import pytest

from benchmarks.torch_step_time import lib
from tests.helpers import benchmark_checks

pytestmark = pytest.mark.backends("torch")

_TINY = lib.Config(
    mlp_depth=1,
    mlp_width=8,
    mlp_batch=4,
    bert_layers=1,
    bert_hidden=8,
    bert_heads=2,
    bert_intermediate=16,
    bert_vocabulary=20,
    bert_sequence=4,
    bert_batch=2,
    **benchmark_checks.TINY_TIMING,
)


def test_run_writes_one_row_per_contender(tmp_path):
    workdir = str(tmp_path)
    rows = lib.run(_TINY, workdir)

    keys = [(r["model"], r["mask"]) for r in rows]
    assert keys == [
        (model, mask) for model in _TINY.models for mask in ("none",) + _TINY.masks
    ]
    written = benchmark_checks.written(workdir, "torch_step_time", rows, lib.COLUMNS)
    assert written["machine"]["backend"] == "torch"
    benchmark_checks.assert_timed_against_none(rows)
    assert len(lib.format_table(rows).splitlines()) == len(rows) + 1


def test_more_than_one_step_per_call_is_refused_before_anything_runs(tmp_path):
    config = dataclasses.replace(_TINY, steps_per_execution=2)
    with pytest.raises(ValueError, match="steps_per_execution=2"):
        lib.run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
