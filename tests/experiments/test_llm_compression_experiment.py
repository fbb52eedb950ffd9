"""experiments.llm_compression: a tiny run writes its outputs, with every pruned entry
kept through healing and quantization; bad configs and flags are refused."""

import json

import numpy as np
import pytest

from tests.helpers import experiment_checks as checks

pytest.importorskip("keras_hub", reason="keras_hub (the [hub] extra) is not installed")
pytest.importorskip("matplotlib", reason="matplotlib (the [experiments] extra)")

from experiments.llm_compression import compress, lib  # noqa: E402

TINY = lib.Config(
    layers=1,
    hidden=16,
    query_heads=2,
    kv_heads=2,
    ffn=24,
    context=8,
    methods=("magnitude", "sparsegpt"),
    targets=("60%", "2:4"),
    healed=("2:4",),
    quantize=("int8",),
    seeds=(0,),
    batch_size=4,
    train_steps=2,
    heal_steps=2,
    calibration=4,
    calibration_batch=2,
    validation_windows=4,
)


@pytest.mark.slow  # ~25 s on 2 cores: a training, 4 prunes, a healing, 4 quantizations
def test_tiny_run_writes_config_metrics_table_and_figure(tmp_path):
    metrics = lib.run(TINY, str(tmp_path))

    for name in ("config.json", "metrics.json", "llm_compression.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "llm_compression.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(
        json.dumps(metrics)
    )
    dense, *pruned, dense_healed = metrics["runs"]
    assert (
        dense["method"] == dense_healed["method"] == "dense" and dense["file_bytes"] > 0
    )
    assert dense_healed["target"] == "healed"
    assert [(r["method"], r["target"]) for r in pruned] == [
        ("magnitude", "60%"),
        ("magnitude", "2:4"),
        ("sparsegpt", "60%"),
        ("sparsegpt", "2:4"),
    ]
    for r in pruned:
        # 60% of each layer: int(0.6 * size) per layer or per SparseGPT block.
        assert r["sparsity"] == pytest.approx(
            0.6 if r["target"] == "60%" else 0.5, abs=2e-3
        )
        assert r["refused"] == 0 and r["seconds"] > 0 and r["peak_bytes"] > 0
        assert np.isfinite(r["perplexity"])
        assert (
            ("healed_perplexity" in r) == ("quantized" in r) == (r["target"] == "2:4")
        )
        for quantized in r.get("quantized", []):  # after healing
            assert quantized["mode"] == "int8"
            assert quantized["zeros_kept"] == quantized["pruned"] > 0
    table = (tmp_path / "llm_compression.md").read_text()
    assert "| sparsegpt | 2:4 | 50.0 [50.0, 50.0] |" in table
    assert "| magnitude | 2:4 | int8 |" in table


def test_targets_read_as_prune_oneshot_keywords():
    assert compress.parse_target("70%") == {"sparsity": 0.7}
    assert compress.parse_target("4:8") == {"pattern": "4:8"}
    with pytest.raises(ValueError, match="'50'"):
        compress.parse_target("50")


test_a_bad_config_is_one_clear_error = checks.bad_config_test(
    lambda changes: lib.Config(**changes),
    [
        (dict(methods=("obs",)), "Received an invalid value for `methods`"),
        (dict(methods=()), "Received an invalid value for `methods`"),
        (dict(targets=("half",)), "Received an invalid target"),
        (dict(healed=("80%",)), "Received an invalid value for `healed`"),
        (dict(quantize=("int2",)), "Received an invalid value for `quantize`"),
        (dict(seeds=()), "Received no targets or no seeds"),
        (dict(calibration=1000), "Received an invalid value for `calibration`"),
        (dict(kv_heads=3), "Received an invalid architecture"),
        (dict(learning_rate=0.0), "Received an invalid optimizer"),
    ],
)


@pytest.mark.slow  # a TensorFlow import in a subprocess: ~11 s of CPU
def test_cli_rejects_bad_flags_before_writing(tmp_path):
    checks.assert_cli_refuses_bad_flags(
        "llm_compression",
        {"--methods=obs": "`methods`", "--targets=half": "invalid target"},
        tmp_path,
    )
