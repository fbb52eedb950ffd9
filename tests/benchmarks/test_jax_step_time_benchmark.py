"""`benchmarks.jax_step_time`, run tiny: one row per contender, files written."""

import dataclasses

import pytest

from benchmarks import hlo
from benchmarks.jax_step_time import lib
from tests.helpers import benchmark_checks

pytestmark = pytest.mark.backends("jax")

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
    hlo=False,  # the untimed test below reads the HLO
    **benchmark_checks.TINY_TIMING,
)


def test_run_writes_one_row_per_contender(tmp_path):
    workdir = str(tmp_path)
    rows = lib.run(_TINY, workdir)

    keys = [(r["model"], r["mask"]) for r in rows]
    assert keys == [
        (model, mask) for model in _TINY.models for mask in ("none",) + _TINY.masks
    ]
    written = benchmark_checks.written(workdir, "jax_step_time", rows, lib.COLUMNS)
    assert written["machine"]["backend"] == "jax"
    benchmark_checks.assert_timed_against_none(rows)
    assert len(lib.format_table(rows).splitlines()) == len(rows) + 1
    assert all(row[key] is None for row in rows for key in hlo.COLUMNS)


def test_untimed_run_reports_the_compiled_steps_hlo(tmp_path):
    config = dataclasses.replace(
        _TINY, models=("mlp",), masks=("element",), hlo=True, timing=False
    )
    rows = lib.run(config, str(tmp_path))

    benchmark_checks.assert_untimed_with_hlo(rows, lib.format_table(rows))


def test_a_pruning_rule_between_its_updates_is_timed(tmp_path):
    # What a magnitude-pruning run's steps cost between the rule's updates.
    config = dataclasses.replace(_TINY, models=("mlp",), masks=("pruning",))
    rows = lib.run(config, str(tmp_path))

    assert [(r["model"], r["mask"]) for r in rows] == [
        ("mlp", "none"),
        ("mlp", "pruning"),
    ]
    benchmark_checks.assert_timed_against_none(rows)


@pytest.mark.backends("tensorflow", "jax")  # the TF and JAX step benchmarks'
def test_the_pruning_contender_prunes_once_then_holds():
    import keras
    import numpy as np

    import maskfit
    from benchmarks.step_time import lib as step_time

    model = maskfit.MaskedSequential([keras.Input((8,)), keras.layers.Dense(8)])
    step_time.set_masks(model, "pruning", 0.75, 0)
    model.compile(keras.optimizers.SGD(0.1), loss="mse")
    x = np.random.default_rng(0).normal(size=(4, 8)).astype("float32")
    model.fit(x, x, batch_size=4, epochs=3, verbose=0)
    kernel = keras.ops.convert_to_numpy(model.layers[0].kernel)
    assert np.count_nonzero(kernel) == 16  # 25% of 64, kept since step 1
