"""Pruned, then `model.quantize("int8" | "int4")`: every pruned entry is still exactly 0.

The zeros are counted in what each quantized layer multiplies by, read by
running the layer on the identity (so a zero point or a scale that moved a
zero would show), against the masks `prune_oneshot` declared.
"""

import keras
import numpy as np
import pytest

import maskfit
from maskfit import internals
from maskfit.oneshot import views
from tests.helpers import hub_cases

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")
# Under JAX the layers run op by op, eagerly: about 20 s, so `slow` there.
pytestmark = [pytest.mark.backends("tensorflow", "jax")] + (
    [pytest.mark.slow] if keras.backend.backend() == "jax" else []
)


def effective(layer, view):
    """The `(in, out)` matrix `layer` multiplies by: the layer run on the identity."""
    n = view.rows[0]
    x = np.eye(n, dtype="float32")
    if view.input_letters:  # (1, n, contracted axes in the input's order)
        contracted = [view.shape[a] for a in view.order[: len(view.contracted)]]
        source = view.input_letters.replace("...", "")
        moved = [2 + view.contracted.index(c) for c in source if c in view.contracted]
        x = np.transpose(x.reshape([1, n] + contracted), [0, 1] + moved)
    y = keras.ops.convert_to_numpy(layer(x))
    return np.asarray(y, np.float64).reshape(n, -1)


def _pruned_llama():
    """A tiny keras_hub Llama pruned by SparseGPT at 50%, and its masked kernels.

    Returns `(lm, found)`: `found` holds `(layer, view, pruned)` for each layer
    `prune_oneshot` masked, `pruned` its `(in, out)` matrix of pruned entries.
    """
    keras.utils.set_random_seed(0)
    backbone = hub_cases.backbone("llama", hidden_dim=32, intermediate_dim=64)
    lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(0, 50, (4, 6)).astype("int32"),
        "padding_mask": np.ones((4, 6), "int32"),
    }
    maskfit.prune_oneshot(lm, [x], "sparsegpt", sparsity=0.5)
    found = []
    for layer in internals.sublayers(lm):
        spec = maskfit.get_mask(layer)
        if spec is not None:
            view = views.kernel_view(layer)
            found.append((layer, view, view.matrix(spec.masks["kernel"] == 0) > 0.5))
    return lm, found


# Both slow (28 s for int8 alone): the fast suite keeps its 10 minutes.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantizing_keeps_every_pruned_entry_zero(mode):
    lm, found = _pruned_llama()
    for layer, view, pruned in found[:2]:  # an EinsumDense and a Dense read right
        matrix = effective(layer, view)
        kernel = view.matrix(keras.ops.convert_to_numpy(view.variable))
        np.testing.assert_allclose(matrix, kernel, atol=1e-5)
        assert np.all(matrix[pruned] == 0)
    with pytest.warns(UserWarning, match="does not have a `quantize` method"):
        lm.quantize(mode)
    assert len(found) == 14
    for layer, view, pruned in found:
        assert layer.quantization_mode == mode
        matrix = effective(layer, view)
        np.testing.assert_array_equal(matrix[pruned], 0.0)
        assert np.count_nonzero(matrix[~pruned]) > 0.9 * np.sum(~pruned)


def _calibrated_config(mode, rng):
    """GPTQ's or AWQ's config on token arrays (the tokenizer only reads strings)."""
    name = {"gptq": "GPTQConfig", "awq": "AWQConfig"}[mode]
    config = getattr(keras.quantizers, name, None)
    if config is None:
        pytest.skip(f"Keras {keras.__version__} has no keras.quantizers.{name}")
    tokens = rng.integers(0, 50, (8, 6)).astype("int32")
    return config(dataset=tokens, tokenizer=object(), num_samples=8, sequence_length=6)


# Keras 3.15.1 and earlier: `model.quantize("gptq")` and `"awq"` never run their
# calibration (keras-team/keras#23512, merged after 3.15.1: the hooks patch
# `layer.call`, which the quantized dtype policy no longer calls), so GPTQ is
# round-to-nearest and keeps every zero. A Keras that calibrates makes GPTQ's
# error feedback write into pruned entries: then the GPTQ case fails here, and
# docs/oneshot.md's advice (int8/int4 or AWQ after pruning) is what keeps them.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["gptq", "awq"])
def test_calibrated_quantizers_keep_every_pruned_entry_zero(mode, monkeypatch):
    config = _calibrated_config(mode, np.random.default_rng(1))
    lm, found = _pruned_llama()
    hessians = []
    if mode == "gptq":  # docs/oneshot.md's reproduction of keras#23512
        from keras.src.quantizers import gptq

        original = gptq.GPTQ.quantize_and_correct_layer

        def spy(self, *args, **kwargs):
            hessians.append(float(keras.ops.max(keras.ops.abs(self.hessian))))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(gptq.GPTQ, "quantize_and_correct_layer", spy)
    with pytest.warns(UserWarning, match="does not have a `quantize` method"):
        lm.quantize(mode, config=config)
    if mode == "gptq":  # uncalibrated: round-to-nearest, which maps 0 to 0
        assert len(hessians) == 14 and max(hessians) == 0.0
    assert len(found) == 14
    for layer, view, pruned in found:
        assert layer.quantization_mode == mode
        matrix = effective(layer, view)
        np.testing.assert_array_equal(matrix[pruned], 0.0)
        assert np.count_nonzero(matrix[~pruned]) > 0.9 * np.sum(~pruned)
