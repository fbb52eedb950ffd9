"""experiments.transformer_pruning: a tiny run writes its outputs (the maskfit arm
without the benchmark packages), the corpus is fixed, bad flags are usage errors."""

import json

import numpy as np
import pytest

from tests.helpers import experiment_checks as checks

pytest.importorskip("keras_hub", reason="keras_hub (the [hub] extra) is not installed")
pytest.importorskip("matplotlib", reason="matplotlib (the [experiments] extra)")

from experiments.transformer_pruning import (  # noqa: E402
    corpus,
    keras_arm,
    lib,
    timing,
    weights,
)

keras_hub = pytest.importorskip("keras_hub")
# The Llama it prunes shrinks into its Mistral twin (keras-hub 0.32), and its
# LiteRT timing needs Keras's `litert` export (Keras 3.15).
pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in keras_hub.__version__.split(".")[:2]) < (0, 32),
    reason=f"keras-hub {keras_hub.__version__}: the experiment needs 0.32",
)

TINY = lib.Config(
    threads=(0, 0),  # this process has run TensorFlow already
    layers=1,
    hidden=16,
    query_heads=2,
    kv_heads=2,
    ffn=24,
    context=8,
    fractions=(0.5,),
    importances=("magnitude", "activation"),
    seeds=(0,),
    batch_size=4,
    train_steps=2,
    heal_steps=2,
    gradual_updates=1,
    calibration=4,
    validation_windows=4,
    latency_batches=(1,),
    latency_rounds=1,
    latency_paths=("tensorflow",),
    torch=False,
)


# A whole tiny run (10-25 s): slow, so README's suite stays under 10 minutes;
# CI runs it.
@pytest.mark.slow
def test_tiny_run_writes_config_metrics_table_and_figure(tmp_path):
    metrics = lib.run(TINY, str(tmp_path))

    for name in ("config.json", "metrics.json", "transformer_pruning.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "transformer_pruning.png").read_bytes()[:4] == b"\x89PNG"
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["corpus"]["sha256"] == corpus.load().sha256
    assert config["corpus"]["python"].count(".") == 2
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(
        json.dumps(metrics)
    )
    assert metrics["torch_arm"].startswith("skipped")
    dense, *pruned, healed = metrics["runs"]
    assert (dense["schedule"], healed["schedule"]) == ("dense", "dense_healed")
    assert healed["params"] == dense["params"]
    # One of two heads and half the FFN units (12) of the block: q, k, v, o of
    # a head (4 x 16 x 8) and gate, up, down of 12 units (3 x 16 x 12).
    assert {r["removed"] for r in pruned} == {4 * 16 * 8 + 3 * 16 * 12}
    # One head of 8 in a width of 16: Llama's config cannot say so, its Mistral twin can.
    assert {r["model"] for r in pruned} == {"MistralCausalLM"}
    assert all(np.isfinite(r["perplexity"]) for r in metrics["runs"])
    assert [(r["framework"], r["fraction"]) for r in metrics["latency"]] == [
        ("tensorflow", 0.0),
        ("tensorflow", 0.5),
    ]
    table = (tmp_path / "transformer_pruning.md").read_text()
    assert "| maskfit | gradual | activation | 50% |" in table
    assert "Torch-Pruning arm skipped: --notorch" in table


def test_corpus_is_fixed_and_batches_follow_the_seed():
    first, second = corpus.load(), corpus.load()
    assert first.sha256 == second.sha256 and len(first.files) == len(corpus.FILES)
    np.testing.assert_array_equal(first.batches(3, 2, 8, 5), second.batches(3, 2, 8, 5))
    assert not np.array_equal(first.batches(3, 2, 8, 5), first.batches(3, 2, 8, 6))
    windows = first.validation_windows(3, 8)
    assert windows.shape == (3, 9) and windows.max() < corpus.VOCABULARY
    np.testing.assert_array_equal(windows[1, 0], windows[0, 8])


def test_initial_weights_are_hugging_faces_scheme_and_follow_the_seed():
    arch = TINY.architecture
    first, again, other = (weights.draw(arch, s) for s in (0, 0, 1))
    assert list(first) == list(again)
    for name, value in first.items():
        np.testing.assert_array_equal(value, again[name])
        assert value.dtype == np.float32
        if name.endswith("norm.weight"):
            np.testing.assert_array_equal(value, np.ones_like(value))
        else:
            assert not np.array_equal(value, other[name]), name
    assert first["model.layers.0.self_attn.q_proj.weight"].shape == (16, 16)
    assert first["model.layers.0.self_attn.k_proj.weight"].shape == (16, 16)
    assert first["model.layers.0.mlp.down_proj.weight"].shape == (16, 24)
    assert first["lm_head.weight"].shape == (corpus.VOCABULARY, 16)
    drawn = np.concatenate(
        [v.ravel() for k, v in first.items() if not k.endswith("norm.weight")]
    )
    assert abs(drawn.mean()) < 1e-3 and abs(drawn.std() - weights.STDDEV) < 1e-3


def test_keras_model_holds_the_drawn_weights_in_its_layout():
    """Grouped (one key/value head for two query heads): head h of q_proj's rows is
    query kernel [:, h, :]; the output kernel's head h is o_proj's columns of h."""
    arch = lib.Config(**dict(vars(TINY), kv_heads=1)).architecture
    drawn = weights.draw(arch, 3)
    lm = keras_arm.build(arch, 3)
    values = {w.path: np.asarray(w) for w in lm.weights}
    layer = "transformer_layer_0/self_attention/"
    q = drawn["model.layers.0.self_attn.q_proj.weight"]
    o = drawn["model.layers.0.self_attn.o_proj.weight"]
    for head in range(2):
        rows = slice(8 * head, 8 * head + 8)
        np.testing.assert_array_equal(
            values[layer + "query/kernel"][:, head], q[rows].T
        )
        np.testing.assert_array_equal(
            values[layer + "attention_output/kernel"][head], o[:, rows].T
        )
    np.testing.assert_array_equal(
        values[layer + "key/kernel"][:, 0],
        drawn["model.layers.0.self_attn.k_proj.weight"].T,
    )
    np.testing.assert_array_equal(
        values["token_embedding/reverse_embeddings"], drawn["lm_head.weight"].T
    )
    np.testing.assert_array_equal(
        values["transformer_layer_0/feedforward_gate_dense/kernel"],
        drawn["model.layers.0.mlp.gate_proj.weight"].T,
    )
    assert len(values) == len(drawn)
    # The same seed, the same model; clone keeps the weights, not a new draw.
    again = keras_arm.build(arch, 3)
    for w in again.weights:
        np.testing.assert_array_equal(np.asarray(w), values[w.path])
    copy = keras_arm.clone(lm, arch, 5)
    for w in copy.weights:
        np.testing.assert_array_equal(np.asarray(w), values[w.path])


def test_hf_weights_inverts_the_keras_layout():
    arch = lib.Config(**dict(vars(TINY), kv_heads=1)).architecture
    drawn = weights.draw(arch, 4)
    back = keras_arm.hf_weights(keras_arm.build(arch, 4), arch)
    assert sorted(back) == sorted(drawn)
    for name, value in drawn.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_torch_adamw_steps_as_pytorchs_adamw_on_repeated_tokens():
    """A token three times in the batch: one dense gradient row (not three squared
    slices), and epsilon after the bias correction, as torch.optim.AdamW."""
    import keras
    import tensorflow as tf

    embedding = keras.layers.Embedding(4, 3)
    embedding.build((None,))
    start = np.asarray(embedding.embeddings).copy()
    ids = tf.constant([0, 0, 0, 1, 2])
    direction = tf.constant(np.linspace(-1.0, 1.0, 15).reshape(5, 3), tf.float32)
    lr, decay, (beta_1, beta_2), epsilon = 0.1, 0.01, (0.9, 0.999), 1e-2
    optimizer = keras_arm.TorchAdamW(
        learning_rate=lr, weight_decay=decay, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon,
    )  # fmt: skip
    expected, m, v = start.astype(np.float64), 0.0, 0.0
    for step in (1, 2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(embedding(ids) * direction * step)
        (grad,) = tape.gradient(loss, [embedding.embeddings])
        assert isinstance(grad, tf.IndexedSlices)
        optimizer.apply_gradients([(grad, embedding.embeddings)])
        dense = np.zeros_like(start, np.float64)
        np.add.at(dense, [0, 0, 0, 1, 2], np.asarray(direction) * step)
        # torch.optim.AdamW's step.
        expected *= 1 - lr * decay
        m = beta_1 * m + (1 - beta_1) * dense
        v = beta_2 * v + (1 - beta_2) * dense**2
        denominator = np.sqrt(v / (1 - beta_2**step)) + epsilon
        expected -= lr / (1 - beta_1**step) * m / denominator
    # Keras computes 1 - beta_2^t in float32 (1.3e-5 off at t=1), PyTorch in float64.
    np.testing.assert_allclose(np.asarray(embedding.embeddings), expected, atol=1e-5)
    # Keras's own AdamW, on the same gradients, lands elsewhere (three squared slices).
    plain = keras.layers.Embedding(4, 3)
    plain.build((None,))
    plain.embeddings.assign(start)
    keras_adamw = keras.optimizers.AdamW(
        learning_rate=lr, weight_decay=decay, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon,
    )  # fmt: skip
    for step in (1, 2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(plain(ids) * direction * step)
        keras_adamw.apply_gradients(
            zip(tape.gradient(loss, [plain.embeddings]), [plain.embeddings])
        )
    assert np.abs(np.asarray(plain.embeddings)[0] - expected[0]).max() > 1e-2


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_keras_and_transformers_llamas_agree_at_the_same_weights(kv_heads):
    """The two arms' models are one function: the same logits at the same weights
    (RoPE, RMSNorm epsilon, grouped heads, untied head). Skips without the
    benchmark extra (torch, transformers), as in the [test] install."""
    pytest.importorskip("torch", reason="torch (the benchmark extra) is not installed")
    pytest.importorskip("transformers", reason="transformers (the benchmark extra)")
    import torch

    from experiments.transformer_pruning import torch_arm

    arch = lib.Config(**dict(vars(TINY), kv_heads=kv_heads)).architecture
    # Larger weights than the initial ones, so attention is far from uniform.
    drawn = weights.draw(arch, 7, stddev=0.3)
    lm = keras_arm.build(arch, 7, initial=False)
    keras_arm.assign(lm, keras_arm.keras_weights(drawn, arch))
    model = torch_arm.build(arch, 7, drawn)
    windows = corpus.load().validation_windows(3, 8)
    x, _ = keras_arm.model_inputs(windows)
    expected = np.asarray(lm(x, training=False))
    with torch.inference_mode():
        logits = model(torch.as_tensor(x["token_ids"].astype(np.int64))).logits
    scale = np.abs(expected).max()
    assert scale > 1.0
    np.testing.assert_allclose(logits.numpy(), expected, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("path", ["litert", "xla"])
def test_compiled_paths_match_the_keras_model(path):
    model = keras_arm.build(TINY.architecture, 0)
    call, error = timing.keras_call(model, 2, 8, corpus.VOCABULARY, path)
    assert tuple(call().shape) == (2, 8, corpus.VOCABULARY)
    assert error < 1e-4


def test_shared_dense_prunes_the_keras_arms_weights_in_both_arms(tmp_path):
    """--shared_dense: Torch-Pruning starts from maskfit's trained dense model, so
    the two arms' dense perplexities agree; equal removed parameters. Skips
    without the benchmark extra."""
    pytest.importorskip("torch", reason="torch (the benchmark extra) is not installed")
    pytest.importorskip("torch_pruning", reason="torch-pruning (the benchmark extra)")
    config = lib.Config(
        **dict(vars(TINY), torch=True, shared_dense=True, schedules=("one_shot",),
               importances=("magnitude",))
    )  # fmt: skip
    metrics = lib.run(config, str(tmp_path))
    dense = {r["arm"]: r for r in metrics["runs"] if r["schedule"] == "dense"}
    np.testing.assert_allclose(
        dense["maskfit"]["perplexity"], dense["torch_pruning"]["perplexity"], rtol=1e-4
    )
    removed = {r["arm"]: r["removed"] for r in metrics["runs"] if "removed" in r}
    assert removed["maskfit"] == removed["torch_pruning"]


test_a_bad_config_is_one_clear_error = checks.bad_config_test(
    lambda changes: lib.Config(**dict(vars(TINY), **changes)),
    [
        (dict(kv_heads=3), "expected kv_heads to divide query_heads"),
        (dict(fractions=(0.5, 1.0)), "`fractions`"),
        (dict(importances=("magnitude", "hessian")), "Received: importances="),
        (dict(schedules=()), "expected a non-empty list"),
        (dict(calibration=100), "`calibration`, expected at most"),
        (dict(train_steps=0), "`train_steps`"),
        (dict(learning_rate=0.0), "expected learning_rate > 0"),
    ],
)


@pytest.mark.slow  # a TensorFlow import in a subprocess: ~11 s of CPU
def test_cli_rejects_bad_flags_before_writing(tmp_path):
    cases = [
        ("--kv_heads=3", "expected kv_heads to divide query_heads"),
        ("--importances=magnitude,hessian", "Received: importances="),
        ("--seeds=a", "--seeds takes comma-separated integers"),
    ]
    checks.assert_cli_refuses_bad_flags("transformer_pruning", cases, tmp_path)


def test_handbuilt_models_compute_the_shrunk_ones_and_are_timed():
    from experiments.transformer_pruning import handbuilt, keras_arm

    arch = keras_arm.Architecture(
        layers=1, hidden=16, query_heads=4, kv_heads=4, ffn=24, context=8
    )
    results = handbuilt.run(
        fractions=(0.5,), batches=(1,), rounds=1, arch=arch, threads=None
    )
    names = {name for (_, path, name) in results if path == "tensorflow"}
    assert names == {"dense", "shrunk 50%", "hand-built 50%"}
    assert all(ms > 0 and ratio > 0 for ms, ratio in results.values())
    assert results[(1, "xla", "dense")][1] == 1.0
