"""Smoke tests of the structured-pruning benchmarks: they run tiny and write their tables.

benchmarks.shrunk_latency and benchmarks.structured_vs_torch_pruning run
with the Keras arm alone everywhere; the PyTorch side (torch and
torch-pruning, the `structured-peer` extra, not in `[test]`) is tested only
where it is installed, and is skipped with the reason otherwise.
"""

import dataclasses
import importlib.util
import json

import numpy as np
import pytest

from benchmarks.shrunk_latency import lib as shrunk_latency_lib
from benchmarks.structured_vs_torch_pruning import lib as structured_lib
from experiments.common import model_cost
from experiments.common.structured import models as sm
from experiments.common.structured import train as structured_train
from experiments.common.structured import widths
from tests.helpers import experiment_checks as checks

_HAS_TORCH = (
    importlib.util.find_spec("torch") is not None
    and importlib.util.find_spec("torch_pruning") is not None
)
requires_torch = pytest.mark.skipif(
    not _HAS_TORCH,
    reason="needs torch and torch-pruning (the structured-peer extra; not in [test])",
)

# One tiny run of each benchmark; the thread pools are left as the tests found them.
_LATENCY = shrunk_latency_lib.Config(
    mlp_hidden=(32, 32),
    resnet_widths=(16, 32),
    frameworks=("keras",),
    keras_paths=("function",),
    batches=(1, 2),
    rounds=1,
    round_seconds=0.001,
    threads=(0, 0),
)
_STRUCTURED = structured_lib.Config(
    **checks.TINY_STRUCTURED,
    fractions=(0.0, 0.5),
    frameworks=("keras",),
    latency_batches=(1,),
    keras_path="function",  # The experiment's test runs the default, LiteRT.
)


def test_shrunk_latency_runs_tiny_and_writes_its_tables(tmp_path):
    rows = shrunk_latency_lib.run(_LATENCY, str(tmp_path))
    keys = [(r["architecture"], r["path"], r["batch"]) for r in rows]
    assert keys == [(a, "function", b) for a in ("mlp", "resnet") for b in (1, 2)]
    mlp = rows[0]
    # Half of every hidden layer, rounded to 8: 16 units.
    assert mlp["params"] == {
        "dense": 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10,
        "shrunk": 64 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10,
    }
    for row in rows:
        assert row["dense_ms"]["median"] > 0 and row["floor_ms"]["median"] > 0
        assert row["ratio"]["median"] > 0 and row["cpu_ratio"]["median"] >= 0
    with open(tmp_path / "shrunk_latency.json") as f:
        written = json.load(f)
    assert written["rows"] == rows and written["machine"]["cores"] >= 1
    table = (tmp_path / "shrunk_latency.md").read_text().splitlines()
    assert len([line for line in table if line.startswith("| keras |")]) == 4
    assert (tmp_path / "config.json").exists()


# A whole tiny run of the benchmark (10-25 s): slow, so README's suite stays
# under 10 minutes; CI runs it.
@pytest.mark.slow
def test_structured_benchmark_runs_tiny_with_the_keras_arm_alone(tmp_path):
    results = structured_lib.run(_STRUCTURED, str(tmp_path))
    runs = results["runs"]
    assert sorted((r["architecture"], r["fraction"]) for r in runs) == [
        ("mlp", 0.0),
        ("resnet", 0.0),
    ]
    for run in runs:
        assert run["framework"] == "keras" and 0 <= run["test_accuracy"] <= 1
        assert run["params"] == run["dense_params"]
    # The reference arm times the dense model against the shrunk shapes.
    timed = {(r["architecture"], r["fraction"]) for r in results["latency_by_fraction"]}
    assert timed == {("mlp", 0.5), ("resnet", 0.5)}
    assert len(results["summary"]) == 2
    with open(tmp_path / "structured_vs_torch_pruning.json") as f:
        assert json.load(f)["runs"] == runs
    table = (tmp_path / "structured_vs_torch_pruning.md").read_text()
    assert "| digits | mlp | keras | 0.00 | 1 |" in table
    assert "| digits | resnet | keras | 0.50 | 1 |" in table


# A whole tiny run of the benchmark (10-25 s): slow, so README's suite stays
# under 10 minutes; CI runs it.
@pytest.mark.slow
def test_maskfit_arm_runs_tiny_and_matches_the_width_rule_and_its_counts(tmp_path):
    config = dataclasses.replace(
        _STRUCTURED, frameworks=("maskfit",), architectures=("mlp",)
    )
    results = structured_lib.run(config, str(tmp_path))
    arch = config.architecture("mlp", "digits")
    by_fraction = {r["fraction"]: r for r in results["summary"]}
    assert sorted(by_fraction) == [0.0, 0.5]
    shrunk = widths.shrunk(arch, 0.5, config.round_to)
    assert (by_fraction[0.5]["params"], by_fraction[0.5]["macs"]) == model_cost.count(
        sm.keras_model(shrunk)
    )
    assert by_fraction[0.5]["follows_width_rule"]
    assert by_fraction[0.5]["prune_seconds"] > 0
    assert "latency_ratio_b1" in by_fraction[0.5]
    for run in results["runs"]:
        assert run["framework"] == "maskfit"
        assert run["shrunk_max_abs_difference"] < 1e-4


def test_default_arms_are_maskfit_and_torch_pruning_where_installed():
    expected = ("torch", "maskfit") if _HAS_TORCH else ("maskfit",)
    assert structured_lib.Config().frameworks == expected


def test_bad_configs_name_what_is_available():
    with pytest.raises(
        ValueError, match=r"expected some of \['keras', 'maskfit', 'torch'\]"
    ):
        structured_lib.Config(frameworks=("tfmot",))
    with pytest.raises(ValueError, match=r"Received: fractions=\(0.5, 1.0\)"):
        structured_lib.Config(fractions=(0.5, 1.0))
    with pytest.raises(ValueError, match=r"keeps none"):
        structured_lib.Config(resnet_widths=(16, 32), fractions=(0.75,))
    with pytest.raises(ValueError, match=r"Received: keras_paths=\('onnx',\)"):
        shrunk_latency_lib.Config(keras_paths=("onnx",))
    with pytest.raises(ValueError, match=r"keeps none"):
        shrunk_latency_lib.Config(resnet_widths=(8, 16))


# --- the PyTorch side ------------------------------------------------------

_ARCHITECTURES = [
    sm.MLP(64, hidden=(32, 24)),
    sm.ResNet((8, 8, 1), widths=(8, 16, 32)),
    sm.ResNet((40, 1), widths=(8, 16), blocks=2),
]


@requires_torch
@pytest.mark.parametrize(
    "arch", _ARCHITECTURES + [widths.shrunk(a, 0.5, 4) for a in _ARCHITECTURES]
)
def test_keras_counts_what_torch_pruning_counts(arch):
    import torch
    import torch_pruning as tp

    from benchmarks.structured_vs_torch_pruning import torch_models

    macs, params = tp.utils.count_ops_and_params(
        torch_models.torch_model(arch), torch.zeros(1, arch.features)
    )
    assert model_cost.count(sm.keras_model(arch)) == (params, int(macs))


@requires_torch
@pytest.mark.parametrize(
    "arch",
    [
        sm.MLP(64, hidden=(32, 24)),
        sm.ResNet((8, 8, 1), widths=(8,)),
        sm.ResNet((40, 1), widths=(8,), blocks=2),
    ],
)
def test_both_frameworks_compute_the_same_network_from_the_same_weights(arch):
    import torch

    from benchmarks.structured_vs_torch_pruning import torch_models

    x = np.random.default_rng(0).standard_normal((5, arch.features)).astype(np.float32)
    keras_out = sm.keras_model(arch, seed=7)(x, training=False).numpy()
    torch_out = torch_models.torch_model(arch, seed=7).eval()(torch.from_numpy(x))
    np.testing.assert_allclose(
        torch_out.detach().numpy(), keras_out, rtol=1e-4, atol=1e-5
    )


@requires_torch
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_both_frameworks_take_the_same_training_steps(optimizer):
    from benchmarks.structured_vs_torch_pruning import torch_models, torch_train

    arch = sm.MLP(16, hidden=(12,))
    rng = np.random.default_rng(0)
    data = type(
        "Data",
        (),
        {
            "x_train": rng.standard_normal((40, 16)).astype(np.float32),
            "y_train": rng.integers(0, 10, 40).astype(np.int32),
        },
    )
    budget = structured_train.Budget(
        optimizer=optimizer, learning_rate=0.01, batch_size=8
    )
    model = structured_train.compile_keras(sm.keras_model(arch, seed=1), budget)
    structured_train.keras_fit(model, data, budget, seed=3, first_epoch=0, last_epoch=2)
    net = torch_models.torch_model(arch, seed=1)
    trainer = torch_train.Trainer(net, data, budget, seed=3)
    trainer.fit(0, 2)
    assert trainer.step == 10
    # Adam's epsilon enters after (PyTorch) or before (Keras) the bias
    # correction: a weight whose gradients are near 0 moves a little differently.
    atol = 1e-5 if optimizer == "sgd" else 1e-4
    np.testing.assert_allclose(
        net.dense_1[0].weight.detach().numpy().T,
        model.get_layer("dense_1").kernel.numpy(),
        rtol=1e-4,
        atol=atol,
    )


@requires_torch
def test_torch_pruning_arm_runs_tiny_and_leaves_the_widths_of_the_rule(tmp_path):
    config = dataclasses.replace(
        _STRUCTURED, frameworks=("torch", "keras"), seeds=(0, 1)
    )
    results = structured_lib.run(config, str(tmp_path))
    torch_runs = [r for r in results["runs"] if r["framework"] == "torch"]
    assert sorted(
        (r["architecture"], r["fraction"], r["seed"]) for r in torch_runs
    ) == [(a, f, s) for a in ("mlp", "resnet") for f in (0.0, 0.5) for s in (0, 1)]
    for run in torch_runs:
        assert run["follows_width_rule"]
        arch = config.architecture(run["architecture"], "digits")
        if run["fraction"]:
            arch = widths.shrunk(arch, run["fraction"], config.round_to)
            assert len(run["step_seconds"]) == config.prune_steps
            assert run["prune_seconds"] > 0
        # Torch-Pruning's counts of what it left are the Keras counts of the rule's shapes.
        assert (run["params"], run["macs"]) == model_cost.count(sm.keras_model(arch))
    rows = {
        (r["architecture"], r["framework"], r["fraction"]): r
        for r in results["summary"]
    }
    assert rows["mlp", "torch", 0.5]["params_removed"] > 0.5
    assert rows["resnet", "torch", 0.5]["latency_ratio_b1"] > 0
    table = (tmp_path / "structured_vs_torch_pruning.md").read_text()
    assert "| digits | resnet | torch | 0.50 | 2 |" in table
