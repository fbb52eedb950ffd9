"""Every keras_hub backbone of `tests/helpers/hub_zoo.py` (54, tiny): sizes and shrinking.

For each: `select_units(model, 0.5)` and `shrink` either give a model whose
outputs equal the masked model's (rtol 1e-5 of the output's scale) or
refuse with one ValueError naming the layer and the operation
(`SHRINK_REFUSED`); never another error. `uniform=True` gives the keras_hub
class with the same outputs, or a ValueError. `size_report`'s parameters
equal `count_params()` before and after, every call's MACs are traced
(no notes), and they hold layer by layer (`_sizes_hold`). docs/structured_pruning.md has the table this test checks.

Every shrunk backbone is also saved to a `.keras` file in a folder the
module shares; the last test loads them all in one fresh Python process
that imports only keras, keras_hub and NumPy (`tests/helpers/hub_saving.py`)
and gives the shrunk models' outputs; those a keras_hub bug stops saving or
loading are `KERAS_HUB_BUGS` (reproduced, small, in `test_hub_zoo_saving.py`).
A backbone whose file is missing (a `-k` selection) is built, shrunk and
saved by that test itself: it never depends on the order tests run in.
"""

import math

import pytest

import maskfit.pruning as pruning
from tests.helpers import hub_cases, hub_saving, hub_zoo

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


# Shrunk backbones a fresh process cannot load because of keras_hub itself
# (keras-hub 0.32), with what the error says: the shrunk ViT is a functional
# model of keras_hub's layers, and `ViTPatchingAndEmbedding.get_config()` writes
# `num_patches` and `num_positions`, which its `__init__` refuses
# (`test_vit_patching_config_does_not_round_trip` is the reproduction;
# the `ViTBackbone` itself loads: its own config rebuilds the layer).
# The shrunk RWKV7 is a functional model of `RWKV7_Block`s; loading builds
# each from its saved `build_config`, whose shape JSON gives back as a list,
# and `RWKV7ChannelMix.build` takes a list for a list of shapes and reads the
# first (None) as the shape (`test_rwkv7_block_does_not_build_from_a_saved_shape`;
# the `RWKV7Backbone` itself loads: its constructor calls the blocks).
# The shrunk DeiT cannot even be saved: `DeiTEncoder.get_config()` reads
# `self.key_dim`, which its `__init__` never sets
# (`test_deit_encoder_config_cannot_be_written`; the `DeiTBackbone` as keras_hub
# builds it cannot be saved either).
# The shrunk GPT-NeoX and Qwen3 are functional models of their keras_hub
# blocks, whose configs do not round trip: `GPTNeoXDecoder.get_config()`
# writes `decoder_sequence_shape`, which its `__init__` refuses;
# `Qwen3TransformerDecoder.get_config()` leaves out `head_dim`, which its
# `__init__` requires (`test_decoder_configs_do_not_round_trip`). The shrunk
# DeBERTa v3 holds keras_hub's `RelativeEmbedding`, whose layer norm is built in
# `call`, not `build`, so loading finds weights for an unbuilt layer
# (`test_relative_embedding_does_not_load`). The tests named are in
# `test_hub_zoo_saving.py`.
KERAS_HUB_BUGS = {
    "ViTBackbone": "Unrecognized keyword arguments passed to ViTPatchingAndEmbedding",
    "RWKV7Backbone": "'NoneType' object is not subscriptable",
    "DeiTBackbone": "'DeiTEncoder' object has no attribute 'key_dim'",
    "GPTNeoXBackbone": "Unrecognized keyword arguments passed to GPTNeoXDecoder",
    "Qwen3Backbone": "missing 1 required positional argument: 'head_dim'",
    "DebertaV3Backbone": "Layer 'rel_embeddings_layer_norm' was never built",
}


@pytest.fixture(scope="module")
def shrunk_folder(tmp_path_factory):
    """Where each backbone's shrunk model is saved for the loading test."""
    return tmp_path_factory.mktemp("shrunk_zoo")


@pytest.mark.parametrize("name", hub_zoo.available())
def test_select_units_and_shrink_work_or_refuse_naming_the_layer(name, shrunk_folder):
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
        found = hub_cases.outputs(small, inputs)
        hub_cases.assert_close(found, expected)
        assert small.count_params() == SHRUNK.get(name, model.count_params())
        _sizes_hold(name, model, small)
        if name in SHRUNK:
            hub_saving.save(shrunk_folder, name, small, inputs, found)
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


def test_shrunk_backbones_load_with_keras_and_keras_hub_alone(shrunk_folder):
    names = [n for n in hub_zoo.available() if n in SHRUNK]
    assert len(names) == len(SHRUNK)
    for name in names:
        if not hub_saving.saved(shrunk_folder, name):  # not run before this test
            model, inputs = hub_zoo.build(name)
            small = pruning.shrink(model, pruning.select_units(model, 0.5))
            assert small.count_params() < model.count_params(), name
            found = hub_cases.outputs(small, inputs)
            hub_saving.save(shrunk_folder, name, small, inputs, found)
    errors, outputs = hub_saving.load_all(shrunk_folder, names)
    assert sorted(errors) == sorted(KERAS_HUB_BUGS), errors
    for name, words in KERAS_HUB_BUGS.items():
        assert words in errors[name], errors[name]
    for loaded, expected in outputs.values():
        hub_cases.assert_close(loaded, expected)
