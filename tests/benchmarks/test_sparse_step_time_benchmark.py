"""Smoke test of the sparse step-time benchmark: it runs tiny and writes its tables."""

import os

import pytest

from benchmarks.sparse_step_time import lib
from tests.helpers import benchmark_checks

# Graph mode only: jit compiles every contender again for no new check.
_TINY = lib.Config(
    modes=("graph",),
    depth=1,
    width=16,
    batch=8,
    delta_t=4,
    rounds_of=1,
    steps_per_execution=2,
    warmup_steps=4,
    repeats=1,
)


def test_run_writes_one_row_per_contender_against_static(tmp_path):
    rows = lib.run(_TINY, str(tmp_path))
    assert [(r["mode"], r["contender"]) for r in rows] == [
        ("graph", c) for c in _TINY.contenders
    ]
    by_name = {r["contender"]: r for r in rows}
    assert by_name["static"]["ratio_median"] == 1.0
    assert by_name["pruning"]["updates_per_round"] == 1
    assert (
        by_name["rigl"]["updates_per_round"] == by_name["set"]["updates_per_round"] == 1
    )
    assert by_name["static"]["updates_per_round"] == 0
    assert all(r["step_ms"] > 0 for r in rows)
    benchmark_checks.written(str(tmp_path), "sparse_step_time", rows, lib.COLUMNS)
    with open(tmp_path / "sparse_step_time.md") as f:
        assert f.read() == lib.format_table(rows)
    assert os.path.exists(tmp_path / "config.json")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(contenders=("static", "magic")), "Unknown contenders"),
        (dict(contenders=("dense", "pruning")), "must include 'static'"),
        (dict(steps_per_execution=30), "must divide delta_t"),
    ],
)
def test_config_refuses_what_it_cannot_time(kwargs, message):
    with pytest.raises(ValueError, match=message):
        lib.Config(**kwargs)
