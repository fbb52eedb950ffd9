"""Every keras_hub backbone a user can build from constructor arguments, tiny.

`CONFIGS` holds, by keras_hub class name, the arguments of a tiny instance
(2 layers per stack, width 16) and its kind: text, vision, audio,
encoder-decoder, multimodal. The tiny configs keep the presets' proportions,
so that a percentage pruned means what it would on a real model: the FFN is
4x the width (BERT, ViT, CLIP, Whisper, OPT, Bloom, DeBERTa, ESM, DINOv2,
DeiT presets: intermediate = 4 x hidden), and every size keras_hub would
otherwise take from a full-size default (DINOv2's position table, ViTDet's
neck channels, Qwen3.5's linear-attention heads, PaliGemma's ViT FFN) is
given a tiny value too. `build(name)` makes it with dropout off and
returns it with a batch of inputs made from its own input specs. `LEFT_OUT`
names the backbones not built here and why (made of other models, such as a
detector around an image encoder); `REFUSED` those built here that
`layerwise_decay` refuses, with the words its message must hold. Checked on keras_hub
0.32; a class an older keras_hub lacks is skipped by `available()`.
"""

import inspect

import keras
import numpy as np

_WIDTH = dict(hidden_dim=16, intermediate_dim=64)
_TEXT = dict(vocabulary_size=50, num_layers=2, **_WIDTH)
_GQA = dict(_TEXT, num_query_heads=2, num_key_value_heads=1)
_SEQ = dict(_TEXT, num_heads=2, max_sequence_length=16)
_IMAGE = (16, 16, 3)
# Qwen3.5's linear-attention heads (keras_hub's defaults: 16 and 32 heads of 128).
_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=2)
_LINEAR |= dict(linear_key_head_dim=8, linear_value_head_dim=8)


def _t5gemma():
    half = dict(_WIDTH, num_layers=2)
    half |= dict(num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    half |= dict(layer_types=["full_attention"] * 2)
    found = dict(vocabulary_size=50)
    for stack in ("encoder", "decoder"):
        found |= {f"{stack}_{key}": value for key, value in half.items()}
    return found


def _towers(vision, text, **extra):
    """A two-tower backbone's arguments: its encoders are made by `build`."""
    return dict(vision_encoder=vision, text_encoder=text, **extra)


_CLIP_TEXT = dict(vocabulary_size=50, embedding_dim=16, num_layers=2, num_heads=2)
_CLIP_TEXT |= dict(max_sequence_length=8, **_WIDTH)
_CLIP_VISION = dict(patch_size=8, num_layers=2, num_heads=2, image_shape=_IMAGE)
_CLIP_VISION |= _WIDTH

# name: (kind, constructor arguments); an argument given as (class name,
# arguments) is a keras_hub model built first.
CONFIGS = {
    # Two groups of one layer each: 2 layers (ALBERT shares a group's layer
    # across its repetitions).
    "AlbertBackbone": ("text", dict(_SEQ, embedding_dim=8, num_groups=2)),
    "BertBackbone": ("text", _SEQ),
    "BloomBackbone": ("text", dict(_TEXT, num_heads=2)),
    "DebertaV3Backbone": ("text", dict(_SEQ, bucket_size=4)),
    "DistilBertBackbone": ("text", _SEQ),
    "ESM2Backbone": ("text", dict(_TEXT, num_heads=2)),
    "ESMBackbone": ("text", dict(_TEXT, num_heads=2)),
    "ElectraBackbone": (
        "text",
        dict(vocab_size=50, num_layers=2, num_heads=2, embedding_dim=8)
        | dict(max_sequence_length=16, **_WIDTH),
    ),
    "FNetBackbone": ("text", dict(_TEXT, max_sequence_length=16)),
    "FalconBackbone": ("text", dict(_TEXT, num_attention_heads=2)),
    "GPT2Backbone": ("text", _SEQ),
    "GPTNeoXBackbone": ("text", _SEQ),
    "GemmaBackbone": ("text", dict(_GQA, head_dim=8)),
    "Gemma3Backbone": (
        "text",
        dict(_GQA, head_dim=8, image_size=16, vision_encoder=None),
    ),
    "GptOssBackbone": ("text", dict(_GQA, num_experts=2, head_dim=8)),
    "Llama3Backbone": ("text", _GQA),
    "LlamaBackbone": ("text", _GQA),
    "MistralBackbone": ("text", _GQA),
    "MixtralBackbone": ("text", dict(_GQA, num_experts=2)),
    "OPTBackbone": ("text", _SEQ),
    "Phi3Backbone": ("text", _GQA),
    "Qwen2Backbone": ("text", _GQA),
    "Qwen3Backbone": ("text", dict(_GQA, head_dim=8)),
    "Qwen3MoeBackbone": (
        "text",
        dict(_GQA, moe_intermediate_dim=8, num_experts=4, top_k=2),
    ),
    "Qwen3_5Backbone": ("text", dict(_GQA, head_dim=8, **_LINEAR)),
    "QwenBackbone": ("text", _GQA),
    "QwenMoeBackbone": (
        "text",
        dict(_GQA, moe_intermediate_dim=8, shared_expert_intermediate_dim=8)
        | dict(num_experts=4, top_k=2),
    ),
    "RobertaBackbone": ("text", _SEQ),
    "RoformerV2Backbone": ("text", dict(_TEXT, num_heads=2, head_size=8)),
    "RWKV7Backbone": (
        "text",
        dict(hidden_size=16, head_size=8, num_layers=2, vocabulary_size=50)
        | dict(intermediate_dim=64),
    ),
    "SmolLM3Backbone": (
        "text",
        dict(_TEXT, num_attention_heads=2, num_key_value_heads=1)
        | dict(attention_bias=False, attention_dropout=0.0, mlp_bias=False)
        | dict(rope_layer_enabled_list=[True, True], layer_norm_epsilon=1e-6)
        | dict(layer_types=["full_attention"] * 2, max_position_embeddings=32)
        | dict(rope_theta=10000.0, partial_rotary_factor=1.0),
    ),
    "XLMRobertaBackbone": ("text", _SEQ),
    "XLNetBackbone": ("text", dict(_TEXT, num_heads=2)),
    "BartBackbone": ("encoder-decoder", _SEQ),
    "EdRecBackbone": (
        "encoder-decoder",
        dict(vocab_size=50, num_layers_enc=2, num_layers_dec=2, num_heads=2, **_WIDTH),
    ),
    "T5Backbone": ("encoder-decoder", dict(_TEXT, num_heads=2, key_value_dim=8)),
    "T5GemmaBackbone": ("encoder-decoder", _t5gemma()),
    "MoonshineBackbone": (
        "audio",
        dict(vocabulary_size=50, filter_dim=16, encoder_num_layers=2)
        | dict(decoder_num_layers=2, encoder_num_heads=2, decoder_num_heads=2)
        | _WIDTH,
    ),
    "WhisperBackbone": (
        "audio",
        dict(_TEXT, num_heads=2, num_mels=8, max_encoder_sequence_length=16)
        | dict(max_decoder_sequence_length=8),
    ),
    "DeiTBackbone": (
        "vision",
        dict(image_shape=_IMAGE, patch_size=8, num_layers=2, num_heads=2, **_WIDTH),
    ),
    "DINOV2Backbone": (
        "vision",
        dict(patch_size=8, num_layers=2, num_heads=2, image_shape=_IMAGE, **_WIDTH)
        | dict(position_embedding_shape=_IMAGE),
    ),
    "DINOV3Backbone": (
        "vision",
        dict(patch_size=8, num_layers=2, num_heads=2, image_shape=_IMAGE, **_WIDTH),
    ),
    "SwinTransformerBackbone": (
        "vision",
        dict(image_shape=(32, 32, 3), embed_dim=8, depths=[2], num_heads=[2])
        | dict(window_size=4, patch_size=4),
    ),
    "ViTBackbone": (
        "vision",
        dict(image_shape=_IMAGE, patch_size=8, num_layers=2, num_heads=2)
        | dict(hidden_dim=16, mlp_dim=64),
    ),
    "ViTDetBackbone": (
        "vision",
        dict(hidden_size=16, num_layers=2, intermediate_dim=64, num_heads=2)
        | dict(global_attention_layer_indices=[1], image_shape=(32, 32, 3))
        | dict(num_output_channels=16)
        | dict(patch_size=8, window_size=2),
    ),
    "ResNetBackbone": (
        "vision",
        dict(input_conv_filters=[64], input_conv_kernel_sizes=[3])
        | dict(stackwise_num_filters=[64, 16], stackwise_num_blocks=[2, 2])
        | dict(stackwise_num_strides=[1, 2], block_type="basic_block")
        | dict(image_shape=_IMAGE),
    ),
    "VGGBackbone": (
        "vision",
        dict(stackwise_num_repeats=[1, 2], stackwise_num_filters=[4, 8])
        | dict(image_shape=_IMAGE),
    ),
    "Gemma4Backbone": ("text", dict(_GQA, head_dim=8, image_size=16)),
    "Qwen3_5MoeBackbone": (
        "text",
        dict(vocabulary_size=50, num_layers=2, num_query_heads=2, head_dim=8)
        | dict(num_key_value_heads=1, hidden_dim=16, moe_intermediate_dim=8)
        | dict(shared_expert_intermediate_size=8, num_experts=4, top_k=2)
        | _LINEAR,
    ),
    "VideoPrismBackbone": (
        "vision",
        dict(num_frames=2, patch_size=8, hidden_dim=16, intermediate_dim=64)
        | dict(num_heads=2, num_spatial_layers=2, num_temporal_layers=2)
        | dict(num_auxiliary_layers=0, image_shape=_IMAGE),
    ),
    "PaliGemmaBackbone": (
        "multimodal",
        dict(_GQA, head_dim=8, image_size=16, vit_patch_size=8, vit_num_heads=2)
        | dict(vit_hidden_dim=16, vit_intermediate_dim=64, vit_num_layers=2),
    ),
    "CLIPBackbone": (
        "multimodal",
        _towers(
            ("CLIPVisionEncoder", _CLIP_VISION),
            ("CLIPTextEncoder", _CLIP_TEXT),
            projection_dim=8,
        ),
    ),
    "MetaCLIP2Backbone": (
        "multimodal",
        _towers(
            ("MetaCLIP2VisionEncoder", _CLIP_VISION),
            ("MetaCLIP2TextEncoder", _CLIP_TEXT),
            projection_dim=8,
        ),
    ),
    "SigLIPBackbone": (
        "multimodal",
        _towers(
            ("SigLIPVisionEncoder", _CLIP_VISION),
            ("SigLIPTextEncoder", _CLIP_TEXT),
        ),
    ),
}

# Backbones not built here, and why.
LEFT_OUT = {
    "BASNetBackbone, DeepLabV3Backbone, DepthAnythingBackbone, RetinaNetBackbone,"
    " SegFormerBackbone, DFineBackbone, PARSeqBackbone": (
        "heads around an image encoder passed in (a backbone above): their own"
        " layers are decoders and necks"
    ),
    "BLIP2Backbone, SAMBackbone, SAM3PromptableConceptBackbone,"
    " StableDiffusion3Backbone, FluxBackbone": (
        "not in this table yet: composed of several models (a Q-Former, a"
        " prompt encoder, a VAE) with no tiny default"
    ),
    "Gemma3nBackbone": (
        "in REFUSED: its embedding processor and its text model hold the same"
        " sublayers and are called apart"
    ),
    "CSPNetBackbone, DenseNetBackbone, EfficientNetBackbone, HGNetV2Backbone,"
    " MiTBackbone, MobileNetBackbone, MobileNetV5Backbone, XceptionBackbone,"
    " FeaturePyramidBackbone": (
        "convolutional: keras.applications' sweep covers these architectures"
    ),
}


# Built here, and refused by layerwise_decay with a message naming this.
REFUSED = {
    "Gemma3nBackbone": (
        "text",
        dict(text_vocab_size=50, text_hidden_size=16, num_hidden_layers=2)
        | dict(pad_token_id=0, num_attention_heads=2, num_key_value_heads=1)
        | dict(head_dim=8, intermediate_size=[64, 64], sliding_window=8)
        | dict(hidden_activation="gelu_approximate", rope_theta=10000.0)
        | dict(layer_types=["full_attention"] * 2, max_position_embeddings=32)
        | dict(vocab_size_per_layer_input=50, hidden_size_per_layer_input=4)
        | dict(altup_num_inputs=2, laurel_rank=4),
        "is held by both",
    ),
}


def available():
    """The names of `CONFIGS` this keras_hub has."""
    import keras_hub

    return [name for name in CONFIGS if hasattr(keras_hub.models, name)]


def _made(value):
    import keras_hub

    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        cls = getattr(keras_hub.models, value[0])
        return cls(**_quiet(cls, value[1]))
    return value


def _quiet(cls, config):
    """`config` with every dropout and drop-path rate the constructor takes at 0."""
    names = inspect.signature(cls.__init__).parameters
    off = {n: 0.0 for n in names if "drop" in n and n not in config}
    return {**config, **off}


def build(name):
    """`(backbone, inputs)`: the tiny backbone `name`, dropout off, and a batch."""
    import keras_hub

    keras.utils.set_random_seed(0)
    cls = getattr(keras_hub.models, name)
    table = CONFIGS if name in CONFIGS else REFUSED
    config = {k: _made(v) for k, v in table[name][1].items()}
    model = cls(**_quiet(cls, config))
    return model, inputs_for(model, config, lengths=LENGTHS.get(name))


# Sequence lengths other than 6, by backbone and input (raw audio: Moonshine's
# first convolution has a kernel of 127 samples and a stride of 64).
# SigLIP's text embedding adds its whole position table: the full length.
LENGTHS = {
    "MoonshineBackbone": {"encoder_input_values": 1600},
    "SigLIPBackbone": {"token_ids": 8},
}


def inputs_for(model, config, batch=2, length=6, lengths=None):
    """A batch for `model`'s inputs: token ids below the vocabulary, masks of 1."""
    vocabulary = next(
        (config[k] for k in ("vocabulary_size", "vocab_size") if k in config), 50
    )
    rng = np.random.default_rng(0)
    specs = model.input
    if isinstance(specs, dict):
        named = specs
    elif isinstance(specs, (list, tuple)):
        named = {spec.name: spec for spec in specs}
    else:
        named = {"x": specs}
    found = {}
    for key, spec in named.items():
        size = (lengths or {}).get(key, length)
        shape = [batch] + [size if d is None else d for d in spec.shape[1:]]
        if "int" in str(spec.dtype) or "bool" in str(spec.dtype):
            if "mask" in key:
                value = np.ones(shape, spec.dtype)
            elif "segment" in key or "type" in key:
                value = np.zeros(shape, spec.dtype)
            else:
                value = rng.integers(1, vocabulary, shape).astype(spec.dtype)
        else:
            value = rng.normal(size=shape).astype("float32")
        found[key] = value
    if isinstance(specs, (list, tuple)):
        return [found[spec.name] for spec in specs]
    return found if isinstance(specs, dict) else found["x"]


__all__ = ["CONFIGS", "LEFT_OUT", "REFUSED", "available", "build", "inputs_for"]
