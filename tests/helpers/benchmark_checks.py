"""What a benchmark run tiny must have written: its rows as JSON and CSV."""

import csv
import json
import os

# A step-time benchmark timed as briefly as it runs: two steps, one repeat.
TINY_TIMING = dict(steps=2, steps_per_execution=1, warmup_steps=1, repeats=1)


def written(workdir, name, rows, columns):
    """Asserts `<name>.json` holds `rows` and `<name>.csv` one row each under
    `columns`; returns the JSON (its machine, its config)."""
    with open(os.path.join(workdir, f"{name}.json")) as f:
        found = json.load(f)
    assert found["rows"] == rows
    with open(os.path.join(workdir, f"{name}.csv")) as f:
        table = list(csv.DictReader(f))
    assert tuple(table[0]) == tuple(columns)
    assert len(table) == len(rows)
    return found


def assert_untimed_with_hlo(rows, table):
    """Rows of a run with `timing=False` (stock first, then one masked): no
    times, and the compiled steps' HLO figures, the masks inside stock's
    fusions; `table` (the run's `format_table`) shows dashes for the times."""
    for row in rows:
        assert row["step_ms"] is None and row["ratio_median"] is None
        assert row["fusions"] > 0 and row["kernels"] >= row["fusions"]
        assert row["fusions_ratio"] == row["kernels_ratio"] == 1.0
    # A 90% ElementMask: one bool per kernel entry, read a few times.
    assert rows[0]["bytes_ratio"] == 1.0 < rows[-1]["bytes_ratio"] < 1.2
    lines = table.splitlines()
    assert len(lines) == len(rows) + 1 and " - " in lines[1]


def assert_timed_against_none(rows):
    """Every row took time; rows without a mask are the baseline (ratio 1)."""
    for row in rows:
        assert row["step_ms"] > 0
        if row["mask"] == "none":
            assert row["ratio_median"] == 1.0
