"""Healing after `prune_oneshot`: every pruned entry stays exactly 0, with fit and with LoRA.

A tiny keras_hub Llama pruned with SparseGPT at 2:4, then trained with AdamW
(weight decay moves an entry whose gradient is 0, so only the masks keep the
zeros): as a `MaskedModel`, every pruned entry is 0 bit for bit; with stock
`fit` they fill. With keras_hub's `enable_lora`, the kernels are frozen and
keep their zeros, but Keras's merged kernel (what it saves) fills them;
`merge_lora` merges without filling them, and the saved file keeps them.
"""

import os

import keras
import numpy as np
import pytest

import maskfit
from maskfit import internals
from tests.helpers import hub_cases

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")
pytestmark = pytest.mark.backends("tensorflow", "jax")


def pruned_llama():
    keras.utils.set_random_seed(0)
    backbone = hub_cases.backbone("llama")
    lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, (8, hub_cases.SEQUENCE + 1)).astype("int32")
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones_like(tokens[:, :-1])}
    report = maskfit.prune_oneshot(lm, [x], "sparsegpt", pattern="2:4")
    return lm, (x, tokens[:, 1:]), report


def pruned_entries(lm, merged=False):
    """`{kernel path: the values at the pruned entries}` (the merged kernel's too)."""
    found = {}
    for layer in internals.sublayers(lm):
        spec = maskfit.get_mask(layer)
        if spec is not None:
            kernel = [w for w in layer.weights if w.name == "kernel"][0]
            value = layer.kernel if merged else kernel
            found[kernel.path] = keras.ops.convert_to_numpy(value)[
                spec.masks["kernel"] == 0
            ]
    return found


def _fit(model, data):
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-2, weight_decay=0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(*data, batch_size=4, epochs=2, verbose=0)


@pytest.mark.parametrize(
    "masked",
    [True, pytest.param(False, marks=pytest.mark.slow)],
    ids=["masked_model", "stock_fit"],
)
def test_fit_keeps_every_pruned_entry_zero_only_with_the_masks(masked):
    lm, data, report = pruned_llama()
    before = [keras.ops.convert_to_numpy(w) for w in lm.trainable_weights]
    _fit(maskfit.MaskedModel(lm.inputs, lm.outputs) if masked else lm, data)
    zeros = pruned_entries(lm)
    assert len(zeros) == len(report.layers) == 14
    if masked:
        for values in zeros.values():
            np.testing.assert_array_equal(values, 0.0)
        after = [keras.ops.convert_to_numpy(w) for w in lm.trainable_weights]
        assert all(not np.array_equal(a, b) for a, b in zip(before, after))
    else:
        assert all(np.count_nonzero(values) for values in zeros.values())


def test_lora_keeps_the_zeros_and_merge_lora_saves_them(tmp_path):
    lm, data, _ = pruned_llama()
    lm.backbone.enable_lora(2)
    _fit(lm, data)
    for values in pruned_entries(lm).values():
        np.testing.assert_array_equal(values, 0.0)
    # Keras's merged kernel, the one it saves, fills the pruned entries of
    # the query and value projections.
    filled = [path for path, v in pruned_entries(lm, merged=True).items() if v.any()]
    assert len(filled) == 4 and all("query" in p or "value" in p for p in filled)
    x = data[0]
    healed = keras.ops.convert_to_numpy(lm(x))
    merge = maskfit.oneshot.merge_lora(lm)
    assert sorted(merge.layers) == sorted(p.rsplit("/", 1)[0] for p in filled)
    assert 0.0 < merge.dropped < 1.0
    for values in pruned_entries(lm, merged=True).values():
        np.testing.assert_array_equal(values, 0.0)
    merged_out = keras.ops.convert_to_numpy(lm(x))
    assert not np.array_equal(merged_out, healed)  # what the dropped delta carried
    path = os.path.join(tmp_path, "healed.keras")
    lm.save(path)
    loaded = {
        w.path: keras.ops.convert_to_numpy(w)
        for w in keras.saving.load_model(path).weights
    }
    for layer in internals.sublayers(lm):
        spec = maskfit.get_mask(layer)
        if spec is not None:
            kernel = [w for w in layer.weights if w.name == "kernel"][0]
            np.testing.assert_array_equal(
                loaded[kernel.path][spec.masks["kernel"] == 0], 0.0
            )


def test_merge_lora_needs_a_lora_layer():
    lm, _, _ = pruned_llama()
    with pytest.raises(ValueError, match="no layer of .* has LoRA enabled"):
        maskfit.oneshot.merge_lora(lm)
