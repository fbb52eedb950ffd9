"""experiments.structured_pruning: tiny end to end, the schedule it prunes on, its config.

The experiment's shrunk models must have exactly the parameters and MACs
that `model_cost.count` gives the architecture of `structured_widths.shrunk`
(Torch-Pruning's width rule), and `StepSchedule` must prune at exactly
the Torch-Pruning arm's steps, to exactly its fractions.
"""

import doctest
import json

import numpy as np
import pytest

import maskfit
from experiments.common import model_cost
from experiments.common.structured import models as sm
from experiments.common.structured import schedule as structured_schedule
from experiments.common.structured import train as structured_train
from experiments.common.structured import widths as structured_widths
from experiments.structured_pruning import lib, report
from tests.helpers import experiment_checks as checks

_TINY = lib.Config(
    **checks.TINY_STRUCTURED,
    fractions=(0.5,),
    latency_batches=(1, 4),
    run_eagerly=True,
)


# About a minute of CPU: in the slow tests, which CI runs too.
@pytest.mark.slow
def test_runs_tiny_end_to_end_and_shrinks_to_the_width_rule(tmp_path):
    metrics = lib.run(_TINY, str(tmp_path))
    for name in ("config.json", "metrics.json", "structured_pruning.md"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "structured_pruning.png").read_bytes()[:4] == b"\x89PNG"
    with open(tmp_path / "metrics.json") as f:
        assert json.load(f)["summary"] == json.loads(json.dumps(metrics["summary"]))
    for kind in ("mlp", "resnet"):
        arch = _TINY.architecture(kind, "digits")
        rows = [r for r in metrics["summary"] if r["architecture"] == kind]
        assert [r["fraction"] for r in rows] == [0.0, 0.5]
        assert (rows[0]["params"], rows[0]["macs"]) == model_cost.count(
            sm.keras_model(arch)
        )
        for row in rows[1:]:
            shrunk = structured_widths.shrunk(arch, row["fraction"], _TINY.round_to)
            assert (row["params"], row["macs"]) == model_cost.count(
                sm.keras_model(shrunk)
            )
            assert row["follows_width_rule"]
            assert set(row["latency"]) == {"1", "4"}
    for run in metrics["runs"]:
        assert run["shrunk_max_abs_difference"] < 1e-4
        assert run["masked_accuracy"] == run["test_accuracy"]
    table = (tmp_path / "structured_pruning.md").read_text()
    assert "| digits | resnet | 0.50 | 1 |" in table


def test_schedule_prunes_at_the_torch_pruning_arms_steps_to_its_fractions():
    budget = structured_train.Budget(
        batch_size=10, epochs=3, prune_epochs=2, prune_steps=3
    )
    schedule = structured_schedule.budget_schedule(100, budget, 0.75)
    torch_steps = structured_train.pruning_steps(
        100, budget
    )  # 0-based, before the update
    assert maskfit.pruning.pruning_steps(schedule, 0, 200) == [
        (step + 1, float(np.float32(0.75 * k / 3)))
        for k, step in zip((1, 2, 3), torch_steps)
    ]
    assert schedule.last_pruning_step() == torch_steps[-1] + 1
    again = structured_schedule.StepSchedule.from_config(schedule.get_config())
    assert again == schedule


@pytest.mark.parametrize(
    "steps, sparsities, match",
    [
        ([], [], "as many sparsities as steps"),
        ([3, 5], [0.5], "as many sparsities as steps"),
        ([5, 3], [0.1, 0.2], "increasing and >= 1"),
        ([0, 3], [0.1, 0.2], "increasing and >= 1"),
        ([3, 5], [0.5, 0.25], "must not decrease"),
        ([3], [1.0], r"sparsities must be a number in \[0, 1\)"),
    ],
)
def test_schedule_refuses_bad_steps(steps, sparsities, match):
    with pytest.raises(ValueError, match=match):
        structured_schedule.StepSchedule(steps, sparsities)


def test_bad_configs_say_what_is_expected():
    with pytest.raises(ValueError, match=r"Received: fractions=\(0.0, 0.5\)"):
        lib.Config(fractions=(0.0, 0.5))
    with pytest.raises(ValueError, match=r"expected some of \('digits', 'mnist1d'\)"):
        lib.Config(datasets=("cifar10",))
    with pytest.raises(ValueError, match=r"Received: keras_path='onnx'"):
        lib.Config(keras_path="onnx")
    with pytest.raises(ValueError, match="keeps none"):
        lib.Config(resnet_widths=(16, 32), fractions=(0.75,))


def test_the_cheap_docstring_examples_hold():
    for module in (structured_schedule, report):
        results = doctest.testmod(module)
        assert results.attempted and not results.failed


@pytest.mark.slow
def test_the_training_docstring_examples_hold():
    from experiments.common.structured import maskfit_arm as structured_maskfit

    for module in (structured_maskfit, lib):
        results = doctest.testmod(module)
        assert results.attempted and not results.failed
