"""experiments.llm_compression: a tiny run writes its outputs, with every pruned entry
kept through healing and quantization; bad configs and flags are refused."""

import json
import sys

import numpy as np
import pytest

from tests.helpers import experiment_checks as checks

pytest.importorskip("keras_hub", reason="keras_hub (the [hub] extra) is not installed")
pytest.importorskip("matplotlib", reason="matplotlib (the [experiments] extra)")

from experiments.llm_compression import compress, lib, peer, report  # noqa: E402
from experiments.transformer_pruning import keras_arm  # noqa: E402

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
        (dict(peer_python="/nonexistent/python"), "invalid value for `peer_python`"),
        (
            dict(peer_python=sys.executable, peer_targets=("80%",)),
            "invalid value for `peer_targets`",
        ),
    ],
)


@pytest.mark.slow  # a TensorFlow import in a subprocess: ~11 s of CPU
def test_cli_rejects_bad_flags_before_writing(tmp_path):
    checks.assert_cli_refuses_bad_flags(
        "llm_compression",
        {"--methods=obs": "`methods`", "--targets=half": "invalid target"},
        tmp_path,
    )


def test_hugging_face_layout_multiplies_as_the_keras_layers():
    """The weights the llmcompressor arm gets (`keras_arm.hf_weights`): each
    `nn.Linear` weight `W` (out, in) gives `x @ W.T` equal to its keras_hub layer's
    output on the same `x`, the heads flattened in Hugging Face's order; the
    untied head gives the logits of keras_hub's reverse embedding. NumPy only."""
    arch = lib.Config(**dict(vars(TINY), kv_heads=1)).architecture
    lm = keras_arm.build(arch, 0)
    hf = keras_arm.hf_weights(lm, arch)
    head_dim = arch.hidden // arch.query_heads
    rng = np.random.default_rng(0)
    block = lm.backbone.transformer_layers[0]
    attention = block._self_attention_layer
    cases = [
        (attention._query_dense, "self_attn.q_proj", (arch.hidden,)),
        (attention._key_dense, "self_attn.k_proj", (arch.hidden,)),
        (attention._value_dense, "self_attn.v_proj", (arch.hidden,)),
        (attention._output_dense, "self_attn.o_proj", (arch.query_heads, head_dim)),
        (block._feedforward_gate_dense, "mlp.gate_proj", (arch.hidden,)),
        (block._feedforward_intermediate_dense, "mlp.up_proj", (arch.hidden,)),
        (block._feedforward_output_dense, "mlp.down_proj", (arch.ffn,)),
    ]
    for layer, name, in_shape in cases:
        weight = hf[f"model.layers.0.{name}.weight"]
        x = rng.normal(size=(2, 3) + in_shape).astype("float32")
        expected = np.asarray(layer(x)).reshape(2, 3, -1)
        np.testing.assert_allclose(
            x.reshape(2, 3, -1) @ weight.T, expected, rtol=1e-5, atol=1e-6,
            err_msg=name,
        )  # fmt: skip
    h = rng.normal(size=(2, 3, arch.hidden)).astype("float32")
    logits = np.asarray(lm.backbone.token_embedding(h, reverse=True))
    np.testing.assert_allclose(h @ hf["lm_head.weight"].T, logits, rtol=1e-5, atol=1e-6)
    # Every keras_hub weight is mapped once, to a Hugging Face name of its shape.
    assert len(hf) == len(lm.weights)
    shapes = {k: v.shape for k, v in weights_draw(arch).items()}
    assert {k: v.shape for k, v in hf.items()} == shapes


def weights_draw(arch):
    from experiments.transformer_pruning import weights

    return weights.draw(arch, 0)


def test_the_arms_inputs_hold_the_same_windows_and_keras_logits(tmp_path):
    arch = TINY.architecture
    lm = keras_arm.build(arch, 0)
    rng = np.random.default_rng(0)
    validation = rng.integers(0, 256, (5, arch.context + 1))
    calibration = rng.integers(0, 256, (4, arch.context))
    path = str(tmp_path / "in.npz")
    peer.write_inputs(path, lm, arch, 0, calibration, 2, validation, ["wanda"], ["2:4"])
    with np.load(path) as found:
        meta = json.loads(str(found["meta"]))
        assert meta["targets"] == ["2:4"] and meta["calibration_batch"] == 2
        np.testing.assert_array_equal(found["calibration"], calibration)
        np.testing.assert_array_equal(found["validation"], validation)
        x, _ = keras_arm.model_inputs(validation[: peer.CHECK_WINDOWS])
        np.testing.assert_array_equal(found["check_logits"], np.asarray(lm(x)))
        assert sorted(k[2:] for k in found.files if k[:2] == "w/") == sorted(
            keras_arm.hf_weights(lm, arch)
        )


def _row(framework, method, target, seed, perplexity, seconds=1.0, **extra):
    row = dict(method=method, target=target, seed=seed, perplexity=perplexity,
               seconds=seconds, sparsity=0.5, **extra)  # fmt: skip
    if framework != "maskfit":
        row["framework"] = framework
    return row


def test_side_by_side_holds_each_seed_to_one_percent_and_its_time():
    peer_name = report.PEER
    runs = [
        _row("maskfit", "wanda", "2:4", 0, 10.0, 2.0, error=0.1),
        _row("maskfit", "wanda", "2:4", 1, 10.2, 1.0, error=0.1),
        _row(peer_name, "wanda", "2:4", 0, 10.0, 3.0),
        _row(peer_name, "wanda", "2:4", 1, 10.0, 3.0),  # seed 1: 2% above
        _row("maskfit", "sparsegpt", "2:4", 0, 9.0, 1.0, error=0.0),
        _row(peer_name, "sparsegpt", "2:4", 0, 9.05, 0.5),
        _row(peer_name, "magnitude", "2:4", 0, None, failure="ValueError: no"),
    ]
    rows = {r["method"]: r for r in report.side_by_side(runs)}
    assert not rows["wanda"]["within_1pct"] and rows["wanda"]["no_longer"]
    assert rows["wanda"]["perplexity_ratio"]["max"] == pytest.approx(1.02)
    assert rows["sparsegpt"]["within_1pct"] and not rows["sparsegpt"]["no_longer"]
    assert rows["magnitude"]["failure"] == "ValueError: no"
    assert "cpu_ratio" not in rows["wanda"]  # no CPU seconds given
    for r in runs:
        r["cpu_seconds"] = r["seconds"] / 2
    rows = {r["method"]: r for r in report.side_by_side(runs)}
    assert rows["wanda"]["no_longer_cpu"] and not rows["sparsegpt"]["no_longer_cpu"]
    assert rows["sparsegpt"]["cpu_ratio"]["max"] == pytest.approx(2.0)
    assert "maskfit" not in rows["magnitude"]
    # The summary keeps the frameworks apart and leaves the failure out.
    summary = report.summarize(runs)
    assert {(r["framework"], r["method"]) for r in summary} == {
        ("maskfit", "wanda"), (peer_name, "wanda"), ("maskfit", "sparsegpt"),
        (peer_name, "sparsegpt"),
    }  # fmt: skip
    lines = report._side_by_side_lines(report.side_by_side(runs))
    assert any(
        "| wanda | 2:4 |" in line and "| no | yes | yes |" in line for line in lines
    )
    assert any("error: ValueError: no" in line for line in lines)
