"""experiments.finetune_recipes: a tiny run writes its outputs; bad flags are usage errors."""

import json

import pytest

from tests.helpers import experiment_checks as checks

pytest.importorskip("keras_hub", reason="keras_hub (the [hub] extra) is not installed")
pytest.importorskip("matplotlib", reason="matplotlib (the [experiments] extra)")

from experiments.finetune_recipes import lib  # noqa: E402

TINY = lib.Config(
    length=16,
    hidden_dim=8,
    num_layers=1,
    num_heads=2,
    intermediate_dim=16,
    pretrain_steps=2,
    batch_size=8,
    train_per_class=2,
    test_per_class=2,
    epochs=1,
    sparse_steps=1,
    seeds=(0,),
    methods=("full", "bitfit", "sparse_10", "lp_ft"),
    isolate=False,
)


# About a minute of CPU: in the slow tests, which CI runs too.
@pytest.mark.slow
def test_tiny_run_writes_config_metrics_table_and_figure(tmp_path):
    metrics = lib.run(TINY, str(tmp_path))

    for name in ("config.json", "metrics.json", "results.md", "results.png"):
        assert (tmp_path / name).exists(), name
    assert json.loads((tmp_path / "config.json").read_text())["methods"] == list(
        TINY.methods
    )
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(
        json.dumps(metrics)
    )
    methods = metrics["methods"]
    assert list(methods) == list(TINY.methods)
    full = methods["full"]
    assert full["learnable_fraction"] == 1.0 and full["step_time_vs_full"] == 1.0
    # BitFit learns the biases and the head; sparse 10% one entry in ten.
    assert 0 < methods["bitfit"]["learnable_fraction"] < 0.5
    assert methods["sparse_10"]["learnable"] == round(0.1 * full["learnable"])
    assert methods["lp_ft"]["learnable_fraction"] == 1.0
    assert all(0 <= m["accuracy_mean"] <= 1 for m in methods.values())
    table = (tmp_path / "results.md").read_text().splitlines()
    assert len(table) == 2 + len(TINY.methods)
    assert metrics["wall_seconds"] > 0 and metrics["cpu_seconds"] > 0


test_a_bad_config_is_one_clear_error = checks.bad_config_test(
    lambda changes: lib.Config(**changes),
    [
        (dict(epochs=0), "`epochs`, expected a positive integer"),
        (dict(decay=1.5), "`decay`, expected a number in (0, 1]"),
        (dict(methods=("head",)), "'full' among them"),
        (dict(methods=("full", "lora")), "Received: methods=('full', 'lora')"),
        (dict(hidden_dim=10, num_heads=4), "not divisible by `num_heads`"),
        (dict(learning_rate=0.0), "`learning_rate`, expected a positive number"),
    ],
)


@pytest.mark.slow  # a TensorFlow import in a subprocess: ~11 s of CPU
def test_cli_rejects_bad_flags_before_writing(tmp_path):
    cases = [
        ("--epochs=0", "`epochs`, expected a positive integer"),
        ("--methods=full,lora", "expected some of full, head"),
        ("--seeds=a", "--seeds takes comma-separated integers"),
        ("--decay=2", "`decay`, expected a number in (0, 1]"),
    ]
    outcomes = checks.assert_cli_refuses_bad_flags(
        "finetune_recipes", cases, tmp_path, [["finetune_recipes"]]
    )
    assert outcomes[-1]["code"] != 0
    assert "--workdir must have a value" in outcomes[-1]["output"]
