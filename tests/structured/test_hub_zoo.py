"""Every keras_hub backbone of `tests/helpers/hub_zoo.py` (54, tiny): sizes and shrinking.

For each: `select_units(model, 0.5)` and `shrink` either give a model whose
outputs equal the masked model's (rtol 1e-5 of the output's scale) or
refuse with one ValueError naming the layer and the operation
(`SHRINK_REFUSED`); never another error. `uniform=True` gives the keras_hub
class with the same outputs, or a ValueError. `size_report`'s parameters
equal `count_params()` before and after, every call's MACs are traced
(no notes), and they hold layer by layer (`_sizes_hold`). docs/structured_pruning.md has the table this test checks.
"""

import math

import pytest

import maskfit.pruning as pruning
from tests.helpers import hub_cases, hub_zoo

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

pytestmark = [
    pytest.mark.backends("tensorflow", "jax"),
    pytest.mark.slow,
    pytest.mark.skipif(
        tuple(int(p) for p in keras_hub.__version__.split(".")[:2]) < (0, 32),
        reason=f"keras-hub {keras_hub.__version__}: the zoo is written for 0.32",
    ),
]

# Backbones whose shrink is refused (keras-hub 0.32): the layer and the
# operation the refusal names.
SHRINK_REFUSED = {
    # QwenSparseMoeBlock takes layers in __init__ and has no get_config.
    "QwenMoeBackbone": "layer 'transformer_layer_0' (QwenMoeTransformerDecoder)"
    " cannot be rebuilt with fewer units: its get_config() raised"
    " NotImplementedError",
    # PatchEmbedding's config holds the LayerNormalization class itself.
    "SwinTransformerBackbone": "layer 'patch_embedding' (PatchEmbedding) cannot be"
    " rebuilt with fewer units: its get_config() raised TypeError",
}

# Parameters after `select_units(model, 0.5)` and `shrink` (docs/structured_pruning.md's
# table); every other backbone removes nothing (or is refused above).
SHRUNK = {
    "AlbertBackbone": 4352,
    "BertBackbone": 4768,
    "DistilBertBackbone": 4464,
    "ElectraBackbone": 4352,
    "GPT2Backbone": 4464,
    "GemmaBackbone": 3440,
    "Llama3Backbone": 5776,
    "LlamaBackbone": 5776,
    "MistralBackbone": 5776,
    "OPTBackbone": 5536,
    "Qwen2Backbone": 5552,
    "QwenBackbone": 5552,
    "RobertaBackbone": 4464,
    "XLMRobertaBackbone": 4464,
    "BartBackbone": 10368,
    "MoonshineBackbone": 22484,
    "ViTBackbone": 6592,
    "ResNetBackbone": 44896,
    "VGGBackbone": 428,
    # Blocks whose coupling is derived from their computation, shrunk by a
    # search of their configs (maskfit/structured/derive/resize.py).
    "BloomBackbone": 5312,
    "FNetBackbone": 3968,
    "Gemma3Backbone": 5008,
    "GptOssBackbone": 9318,
    "MixtralBackbone": 9424,
    "Phi3Backbone": 6288,
    "Qwen3MoeBackbone": 4912,
    "Qwen3_5Backbone": 7848,
    "RWKV7Backbone": 15056,
    "SmolLM3Backbone": 5496,
    "WhisperBackbone": 13344,
    "DINOV2Backbone": 7824,
    "DINOV3Backbone": 7728,
    "Gemma4Backbone": 5074,
    "Qwen3_5MoeBackbone": 6856,
    "VideoPrismBackbone": 12144,
    "PaliGemmaBackbone": 11344,
    "CLIPBackbone": 13350,
    "MetaCLIP2Backbone": 13345,
    "SigLIPBackbone": 15534,
    # Derived once the derivation calls a block with all its arguments and
    # rebuilds keras_hub's configs in the worker (before: nothing removed).
    "DebertaV3Backbone": 5440,
    "ESM2Backbone": 5280,
    "ESMBackbone": 5280,
    "FalconBackbone": 5280,
    "GPTNeoXBackbone": 5280,
    "Qwen3Backbone": 5008,
    "RoformerV2Backbone": 5008,
    "EdRecBackbone": 13248,
    "T5Backbone": 13408,
    "T5GemmaBackbone": 11168,
    "DeiTBackbone": 7696,
    "ViTDetBackbone": 10576,
}

# The backbones `shrink(uniform=True)` rebuilds in their keras_hub class (or
# its twin); the others are refused with a ValueError.
UNIFORM = [
    "GemmaBackbone",
    "Llama3Backbone",
    "LlamaBackbone",
    "MistralBackbone",
    "OPTBackbone",
    "Qwen2Backbone",
    "QwenBackbone",
]


def _kernel_entries(layer):
    """Entries of the kernels `layer` holds (each multiplies at least once a call)."""
    return sum(
        math.prod(v.shape)
        for v in layer.weights
        if "kernel" in v.path.split("/")[-1] and len(v.shape) >= 2
    )


def _sizes_hold(name, model, small):
    """`size_report`'s totals are `count_params()`'s, and its MACs hold layer by layer.

    Every call traced (no note), at the shapes the model makes; every layer
    that holds a kernel counts at least one MAC per kernel entry (one token
    or pixel); no layer's MACs grow, and a layer that lost parameters with
    MACs lost MACs too.
    """
    report = pruning.size_report(model, small)
    assert report.params_before == model.count_params()
    assert report.params_after == small.count_params()
    assert report.macs_before > 0
    assert report.notes == ()
    assert report.macs_after <= report.macs_before
    layers = {
        layer.name: layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
    }
    for row in report.rows:
        kernels = _kernel_entries(layers[row.name.split("/")[-1]])
        assert row.macs_before >= kernels, (row, kernels)
        assert row.macs_after <= row.macs_before, row
        if row.params_after < row.params_before and row.macs_before:
            assert row.macs_after < row.macs_before, row


@pytest.mark.parametrize("name", hub_zoo.available())
def test_select_units_and_shrink_work_or_refuse_naming_the_layer(name):
    model, inputs = hub_zoo.build(name)
    selection = pruning.select_units(model, 0.5)
    expected = hub_cases.masked_outputs(selection, inputs)
    if name in SHRINK_REFUSED:
        with pytest.raises(ValueError, match="shrink: ") as refused:
            pruning.shrink(model, selection)
        assert SHRINK_REFUSED[name] in str(refused.value)
        _sizes_hold(name, model, model)
    else:
        small = pruning.shrink(model, selection)
        hub_cases.assert_close(hub_cases.outputs(small, inputs), expected)
        assert small.count_params() == SHRUNK.get(name, model.count_params())
        _sizes_hold(name, model, small)
    try:
        same = pruning.shrink(model, selection, uniform=True)
    except ValueError as error:
        assert name not in UNIFORM
        assert "shrink(uniform=True)" in str(error) and "uniform=False" in str(error)
    else:
        assert name in UNIFORM
        assert type(same).__name__.endswith("Backbone")
        hub_cases.assert_close(hub_cases.outputs(same, inputs), expected)
        assert same.count_params() < model.count_params()
