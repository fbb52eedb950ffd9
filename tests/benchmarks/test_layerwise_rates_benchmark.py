"""Smoke test of the layer-wise decay benchmark: it runs tiny and writes its table."""

import csv
import json
import os

import keras
import pytest

from benchmarks.layerwise_rates import lib

# Graph mode only: jit compiles each contender again; the mode is one
# compile() argument.
_TINY = lib.Config(
    blocks=3,
    width=8,
    batch=4,
    modes=("graph",),
    steps=2,
    steps_per_execution=1,
    warmup_steps=1,
    repeats=1,
)
_MULTI = hasattr(keras.optimizers, "MultiOptimizer")


def test_run_writes_one_row_per_contender_and_compares_weights(tmp_path):
    rows = lib.run(_TINY, str(tmp_path))

    names = [row["contender"] for row in rows]
    expected = [n for n in lib.CONTENDERS if _MULTI or n != "multi_optimizer"]
    assert names == expected
    with open(tmp_path / "layerwise_rates.json") as f:
        written = json.load(f)
    assert written["rows"] == rows and "MultiOptimizer" in written["what"]
    with open(tmp_path / "layerwise_rates.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert os.path.exists(tmp_path / "config.json")
    by_name = {row["contender"]: row for row in rows}
    assert by_name["keras"]["ratio_to_keras"] == 1.0
    assert set(rows[0]) == set(lib.COLUMNS)
    assert all(row["step_ms"] > 0 for row in rows)
    if _MULTI:
        # The mechanism alone steps each block as its own optimizer would.
        assert by_name["rates_step"]["agrees"] is True
        assert by_name["multi_optimizer"]["max_abs_diff"] == 0.0
        # Without per-block rates the weights differ, and the check sees it.
        assert by_name["keras"]["agrees"] is False
    else:
        assert all(row["agrees"] is None for row in rows)
    assert len(lib.format_table(rows).splitlines()) == len(rows) + 1


@pytest.mark.parametrize(
    "bad", [dict(blocks=1), dict(decay=0.0), dict(decay=1.5), dict(modes=("eager",))]
)
def test_config_refuses_what_it_cannot_measure(bad):
    with pytest.raises(ValueError):
        lib.Config(**bad)
