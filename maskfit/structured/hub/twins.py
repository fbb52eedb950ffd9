"""keras_hub classes that compute as another class and can write a head size.

keras_hub's Llama blocks derive their head size from `hidden_dim //
num_query_heads`, so a Llama block with fewer heads cannot be written in a
Llama config. Mistral's blocks compute exactly as Llama's (RMS norm, rotary
embedding, grouped-query attention, SwiGLU FFN; checked equal on random
weights in the tests) when Mistral's sliding window is off and Llama's rope
has no frequency adjustment, and they take a `head_dim`: a Llama model with
fewer heads is shrunk into its Mistral twin (`MistralBackbone`,
`MistralTransformerDecoder`, `MistralCausalLM`), weight for weight.
"""

__all__ = ["TWINS", "twin_problem", "twin_takes_head_dim"]

_LLAMA_ROPE = (
    "rope_frequency_adjustment_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_pretraining_sequence_length",
)


def twin_problem(layer):
    """Why a Llama block has no Mistral twin (a clause), or None."""
    set_ = [n for n in _LLAMA_ROPE if getattr(layer, n, None) is not None]
    if set_:
        return (
            f"its rope has {set_[0]} set (Llama 3.1 scaling), which Mistral's rope"
            " does not compute"
        )
    if not twin_takes_head_dim():
        return (
            "this keras_hub's MistralTransformerDecoder takes no head_dim (keras-hub"
            " 0.32 does; pip install -U keras-hub to prune Llama's heads)"
        )
    return None


def twin_takes_head_dim():
    """Whether the installed keras_hub's Mistral block takes a `head_dim`."""
    import inspect

    block = twin_class("LlamaTransformerDecoder")
    return "head_dim" in inspect.signature(block.__init__).parameters


# The config keys a Llama block and backbone share with their Mistral twins.
_BLOCK_KEYS = (
    "name",
    "trainable",
    "dtype",
    "intermediate_dim",
    "num_query_heads",
    "num_key_value_heads",
    "rope_max_wavelength",
    "activation",
    "layer_norm_epsilon",
    "kernel_initializer",
    "dropout",
)
_BACKBONE_KEYS = (
    "name",
    "trainable",
    "dtype",
    "vocabulary_size",
    "num_layers",
    "num_query_heads",
    "hidden_dim",
    "intermediate_dim",
    "num_key_value_heads",
    "rope_max_wavelength",
    "layer_norm_epsilon",
    "dropout",
)


def _translated(keys):
    """`(config, head_dim) -> twin config`: `keys` kept, Mistral's own fields set."""

    def translate(config, head_dim):
        found = {k: config[k] for k in keys if k in config}
        found["rope_scaling_factor"] = config.get("rope_position_scaling_factor", 1.0)
        found["sliding_window"] = None
        found["head_dim"] = head_dim
        return found

    return translate


# block class -> (its twin's module and class, config translation)
TWINS = {
    "LlamaTransformerDecoder": (
        "keras_hub.src.models.mistral.mistral_transformer_decoder",
        "MistralTransformerDecoder",
        _translated(_BLOCK_KEYS),
    ),
    "LlamaBackbone": (
        "keras_hub.models",
        "MistralBackbone",
        _translated(_BACKBONE_KEYS),
    ),
    "Llama3Backbone": (
        "keras_hub.models",
        "MistralBackbone",
        _translated(_BACKBONE_KEYS),
    ),
    "LlamaCausalLM": ("keras_hub.models", "MistralCausalLM", None),
    "Llama3CausalLM": ("keras_hub.models", "MistralCausalLM", None),
}


def twin_class(name):
    """The twin class of the keras_hub class called `name` (imports keras_hub)."""
    import importlib

    if name not in TWINS:
        raise ValueError(
            f"shrink: {name} would need a class that can write a head size of its"
            f" own, and maskfit knows none for it (it knows {sorted(TWINS)})."
            " Keep its heads (ignored_layers, or prune its FFN units only)."
        )
    module, twin, _ = TWINS[name]
    return getattr(importlib.import_module(module), twin)


def twin_config(name, config, head_dim):
    """`config` of a `name` layer or model, as its twin's config."""
    return TWINS[name][2](config, head_dim)
