"""Fine-tuning recipes on a tiny keras_hub BERT: frozen entries stay bit-identical.

Each recipe is declared, then the model is fit under AdamW with weight decay
(which moves every entry it is given) in graph and jit modes: the entries the
recipe freezes are compared with np.testing.assert_array_equal, and what it
trains must move. Under both backends; JAX jits a compiled step either way, so
there the one mode is jit.
"""

import doctest

import keras
import numpy as np
import pytest

import maskfit
from maskfit.spec import recipes
from tests.helpers import hub_cases

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras_hub (the [hub] extra) is not installed"
)

pytestmark = pytest.mark.backends("tensorflow", "jax", "torch")

MODES = {"graph": dict(), "jit": dict(jit_compile=True)}
# BitFit runs in both modes in the default run; the other recipes' jit cases
# are `slow` (the step and its masks are the same machinery).
JIT_SLOW = ["graph", pytest.param("jit", marks=pytest.mark.slow)]
BOTH = list(MODES)
if keras.backend.backend() == "jax":
    BOTH = JIT_SLOW = ["jit"]
elif keras.backend.backend() == "torch":
    # torch.compile of the BERT step: about a minute on 2 CPU cores, most of
    # the torch fast suite's time; the slow tests keep it.
    BOTH = JIT_SLOW


def classifier():
    """BertBackbone (1 layer, width 8) -> first token -> Dense(3) 'head'."""
    keras.utils.set_random_seed(0)
    backbone = hub_cases.backbone(
        "bert",
        vocabulary_size=30,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=8,
    )
    names = ("token_ids", "segment_ids", "padding_mask")
    inputs = {n: keras.Input((None,), dtype="int32", name=n) for n in names}
    hidden = backbone(inputs)["sequence_output"][:, 0, :]
    model = maskfit.MaskedModel(inputs, keras.layers.Dense(3, name="head")(hidden))
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(1, 20, (16, 6)).astype("int32"),
        "segment_ids": np.zeros((16, 6), "int32"),
        "padding_mask": np.ones((16, 6), "int32"),
    }
    return model, backbone, x, rng.integers(0, 3, 16)


def compile_(model, mode):
    model.compile(
        optimizer=keras.optimizers.AdamW(0.01, weight_decay=0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **MODES[mode],
    )


def fit_and_check(model, x, y, frozen, mode, steps=2):
    """Fits; `frozen(variable)` is the 0/1 array (or bool) of entries that must not move."""
    start = {v.path: v.numpy() for v in every_variable(model)}
    if getattr(model, "optimizer", None) is None:
        compile_(model, mode)
    model.fit(x, y, batch_size=8, epochs=1, steps_per_epoch=steps, verbose=0)
    moved_any = False
    for v in every_variable(model):
        keep = np.broadcast_to(np.asarray(frozen(v), bool), v.shape)
        np.testing.assert_array_equal(v.numpy()[keep], start[v.path][keep], v.path)
        moved_any |= bool(np.any(v.numpy()[~keep] != start[v.path][~keep]))
    assert moved_any
    return start


def every_variable(model):
    """Trainable variables, the frozen ones included (`MaskedModel.trainable_weights`
    leaves out those whose mask is 0 everywhere)."""
    return [v for v in model.weights if v.trainable]


def paths_moved(model, start):
    return {v.path for v in every_variable(model) if np.any(v.numpy() != start[v.path])}


@pytest.mark.parametrize("mode", BOTH)
def test_bitfit_trains_only_biases(mode):
    model, _, x, y = classifier()
    learns = set(maskfit.bitfit(model))
    assert learns and all(p.endswith(("/bias", "/beta")) for p in learns)
    start = fit_and_check(model, x, y, lambda v: v.path not in learns, mode)
    assert paths_moved(model, start) <= learns
    assert "head/bias" in {p[-9:] for p in paths_moved(model, start)}


@pytest.mark.parametrize("mode", JIT_SLOW)
def test_train_only_the_matching_paths(mode):
    model, _, x, y = classifier()
    learns = set(maskfit.train_only(model, [r"^dense/", r"head/", r"intermediate"]))
    assert any("intermediate" in p for p in learns)
    fit_and_check(model, x, y, lambda v: v.path not in learns, mode)


@pytest.mark.parametrize("mode", JIT_SLOW)
def test_only_the_new_rows_of_an_embedding_learn(mode):
    model, backbone, x, y = classifier()
    maskfit.train_only(model, r"head/")
    table = backbone.token_embedding
    new = [x["token_ids"][0, 0], x["token_ids"][1, 0]]
    maskfit.train_embedding_rows(table, new)
    rows = np.zeros((30, 1), bool)
    rows[new] = True

    def frozen(v):
        if v is table.embeddings:
            return ~rows
        return "head/" not in v.path

    fit_and_check(model, x, y, frozen, mode)
    assert np.all(table.embeddings.numpy()[new] != 0)


@pytest.mark.parametrize("mode", JIT_SLOW)
def test_sparse_finetuning_trains_the_k_entries_that_moved_most(mode):
    model, _, x, y = classifier()
    start = {v.path: v.numpy() for v in every_variable(model)}
    compile_(model, mode)
    count = maskfit.sparse_finetune(model, x, y, k=0.1, steps=2, batch_size=8)
    total = sum(v.numpy().size for v in every_variable(model))
    assert count == round(0.1 * total)
    # The short pass is undone: weights and the optimizer's step count.
    for v in every_variable(model):
        np.testing.assert_array_equal(v.numpy(), start[v.path])
    assert int(model.optimizer.iterations.numpy()) == 0
    masks = {
        path: mask
        for layer, spec in maskfit.spec.declare.masked_layers(model)
        for path, mask in ((v.path, m) for v, m, _ in spec.resolve(layer))
    }
    assert sum(int(m.sum()) for m in masks.values()) == count
    fit_and_check(model, x, y, lambda v: masks[v.path] == 0, mode)


@pytest.mark.parametrize("mode", JIT_SLOW)
def test_linear_probe_then_full_finetuning_switches_inside_one_fit(mode):
    model, _, x, y = classifier()
    head = model.get_layer("head")
    waiting = set(maskfit.probe_then_finetune(model, head, switch_step=2))
    assert waiting and not any(p.startswith("head/") for p in waiting)
    start = fit_and_check(model, x, y, lambda v: v.path in waiting, mode, steps=2)
    assert paths_moved(model, start) == {v.path for v in head.trainable_weights}
    model.fit(x, y, batch_size=8, epochs=1, steps_per_epoch=1, verbose=0)
    # All but pooled_dense, which the first token's features do not use:
    # TensorFlow gives it no gradient and Keras leaves it be. JAX gives it a
    # gradient of zeros, and AdamW's weight decay moves its kernel (its bias
    # is still 0, which decay keeps).
    unused = {p for p in waiting if "pooled_dense" in p}
    if keras.backend.backend() == "jax":
        unused = {p for p in unused if p.endswith("/bias")}
    assert paths_moved(model, start) == waiting - unused | {
        v.path for v in head.trainable_weights
    }


def test_bad_input_is_one_clear_error():
    model, backbone, x, y = classifier()
    with pytest.raises(ValueError, match="none of \\['nothing_here'\\] matches"):
        maskfit.train_only(model, ["nothing_here"])
    with pytest.raises(ValueError, match="regular expressions"):
        maskfit.train_only(model, ["("])
    with pytest.raises(ValueError, match=r"token ids in \[0, 30\).*rows=array\(\[30\]"):
        maskfit.train_embedding_rows(backbone.token_embedding, [30])
    with pytest.raises(ValueError, match="non-empty"):
        maskfit.train_embedding_rows(backbone.token_embedding, [])
    with pytest.raises(ValueError, match="`embeddings` variable"):
        maskfit.train_embedding_rows(model.get_layer("head"), [0])
    with pytest.raises(ValueError, match="has no optimizer"):
        maskfit.sparse_finetune(model, x, y, k=5, steps=1)
    compile_(model, "graph")
    for k in (0, -1, 10**9, 1.0, 1.5, float("nan"), True, "10"):
        with pytest.raises(ValueError, match="`k`, the entries that learn"):
            maskfit.sparse_finetune(model, x, y, k=k, steps=1)
    with pytest.raises(ValueError, match="`steps`"):
        maskfit.sparse_finetune(model, x, y, k=5, steps=0)
    with pytest.raises(ValueError, match="`switch_step` as a positive integer"):
        maskfit.probe_then_finetune(model, model.get_layer("head"), 0)
    with pytest.raises(ValueError, match="head as layers of"):
        maskfit.probe_then_finetune(model, keras.layers.Dense(2), 3)


def test_the_docstring_examples_run():
    results = doctest.testmod(recipes, extraglobs=dict(keras=keras, maskfit=maskfit))
    assert results.attempted > 0 and results.failed == 0
