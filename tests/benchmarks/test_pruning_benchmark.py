"""Smoke test of the side-by-side pruning benchmark: it runs tiny, writes its tables."""

import json
import os

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("tensorflow_model_optimization")

from benchmarks.pruning_vs_tfmot import lib as pruning_lib  # noqa: E402

# 128 examples in batches of 32: 4 steps per epoch, 2 epochs.
_TINY = pruning_lib.Config(
    scenarios=("polynomial", "2:4"),
    seeds=(0,),
    hidden=(16,),
    epochs=2,
    max_train_examples=128,
)


@pytest.fixture(autouse=True)
def _keep_legacy_keras_flag_local():
    """TF-MOT's import sets TF_USE_LEGACY_KERAS=1; keep it from later tests."""
    before = os.environ.get("TF_USE_LEGACY_KERAS")
    yield
    if before is None:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
    else:
        os.environ["TF_USE_LEGACY_KERAS"] = before


# A whole tiny run of the benchmark (10-25 s): slow, so README's suite stays
# under 10 minutes; CI runs it.
@pytest.mark.slow
def test_both_contenders_run_tiny_and_report_sparsity_at_every_pruning_step(
    tmp_path, monkeypatch
):
    tiny_polynomial = dict(pruning_lib.SCENARIOS["polynomial"])
    tiny_polynomial["arguments"] = dict(
        initial_sparsity=0.0, final_sparsity=0.9, begin_step=0, end_step=6, frequency=2
    )
    monkeypatch.setitem(pruning_lib.SCENARIOS, "polynomial", tiny_polynomial)

    results = pruning_lib.run(_TINY, str(tmp_path))

    runs = {(r["scenario"], r["contender"]): r for r in results["runs"]}
    assert sorted(runs) == [
        ("2:4", "keras"),
        ("2:4", "maskfit"),
        ("2:4", "tf_keras"),
        ("2:4", "tfmot"),
        ("polynomial", "keras"),
        ("polynomial", "maskfit"),
        ("polynomial", "tf_keras"),
        ("polynomial", "tfmot"),
    ]
    # The references train the same model without pruning, on each Keras.
    for reference in ("keras", "tf_keras"):
        assert runs["polynomial", reference]["final_zeros"]["64x16"] == 0
        assert not runs["polynomial", reference]["pruning"]
    assert set(results["paired_step_time"]) == {"maskfit", "keras", "tf_keras"}
    # What each library's pruning adds to its own Keras's step.
    assert set(results["own_cost"]) == {"maskfit", "tfmot"}
    assert results["own_cost"]["tfmot"]["2:4"]["epochs"] == 1
    assert results["paired_step_time"]["maskfit"]["polynomial"]["epochs"] == 1
    assert results["paired_step_time"]["maskfit"]["polynomial"]["total"] > 0
    for contender in ("tfmot", "maskfit"):
        polynomial = runs["polynomial", contender]
        assert [s["step"] for s in polynomial["pruning_steps"]] == [2, 4, 6]
        assert polynomial["follows_schedule"]
        # From step 6 on, 90% of each kernel is zero (64x16: 1024 entries, 102 kept).
        assert polynomial["final_zeros"]["64x16"] == 1024 - 102
        two_of_four = runs["2:4", contender]
        assert [s["step"] for s in two_of_four["pruning_steps"]] == [1]
        assert two_of_four["final_zeros"] == {"64x16": 512, "16x10": 80}
    # The same masks at every pruning step, from the same weights and batches.
    for scenario in ("polynomial", "2:4"):
        assert [s["zeros"] for s in runs[scenario, "maskfit"]["pruning_steps"]] == [
            s["zeros"] for s in runs[scenario, "tfmot"]["pruning_steps"]
        ]
    # maskfit's pruned weights are 0 after every step; TF-MOT's optimizer
    # moves them until its callback masks them again at the end of the epoch.
    assert runs["polynomial", "maskfit"]["pruned_are_zero"]
    assert not runs["polynomial", "tfmot"]["pruned_are_zero"]
    for run in results["runs"]:
        assert 0.0 <= run["test_accuracy"] <= 1.0 and run["step_ms"] > 0

    with open(tmp_path / "pruning_vs_tfmot.json") as f:
        assert json.load(f)["runs"] == results["runs"]
    table = (tmp_path / "pruning_vs_tfmot.md").read_text()
    assert "| polynomial | tfmot | 1 |" in table
    assert "| polynomial | maskfit | 1 |" in table
    assert "| polynomial | keras | 1 |" in table and " | - | - | - |" in table
    assert "| polynomial | tf_keras | 1 |" in table
    assert (
        "| 2:4 | maskfit / keras | " in table and "| 2:4 | tfmot / tf_keras | " in table
    )
    # 160 - 16 kept in 16x10, per contender.
    assert "| 6 | 0.900000 | 922 | 922 | 144 | 144 |" in table
    assert (tmp_path / "config.json").exists()


def test_unknown_contenders_are_refused_with_what_is_available():
    with pytest.raises(
        ValueError, match=r"available: \['keras', 'maskfit', 'tf_keras', 'tfmot'\]"
    ):
        pruning_lib.Config(contenders=("torch",))


def test_paired_step_time_reports_the_median_and_the_total_ratio():
    def run(contender, seed, epochs):
        return {
            "contender": contender,
            "scenario": "polynomial",
            "seed": seed,
            "epoch_seconds": epochs,
            "epoch_cpu_seconds": [2 * e for e in epochs],
        }

    # Seed 1's third epoch has a retrace: the median skips it, the total not.
    runs = [
        run("tfmot", 0, [9.0, 1.0, 1.0]),
        run("maskfit", 0, [9.0, 0.9, 0.9]),
        run("tfmot", 1, [9.0, 1.0, 1.0]),
        run("maskfit", 1, [9.0, 0.9, 2.9]),
    ]
    row = pruning_lib.paired_step_time(runs)["polynomial"]
    assert row["epochs"] == 4
    assert row["median"] == pytest.approx(0.9)
    assert row["total"] == pytest.approx(5.6 / 4.0)
    assert row["cpu_total"] == pytest.approx(5.6 / 4.0)
