"""The initial weights both arms start from: drawn with numpy from the seed.

Each framework's own initializers draw different weights from the same
seed (and from different distributions: Keras's Glorot against PyTorch's
normal(0, 0.02) in transformers' Llama), which put a gap between the two
arms' dense models before any pruning. `draw` makes one set of initial
weights instead, in Hugging Face Llama's scheme (normal(0, 0.02) for every
linear layer and both embeddings, ones for the RMSNorm scales) and in
Hugging Face's layout and names (`model.layers.0.self_attn.q_proj.weight`:
`(heads * head_dim, hidden)`, an `nn.Linear`'s `(out, in)`); the Keras arm
reshapes them into keras_hub's kernels (`keras_arm.assign`), the PyTorch arm
copies them as they are (`torch_arm.build`). numpy only: the maskfit arm
runs without torch. `sizes` spells the architecture both arms build in each
library's arguments.
"""

import numpy as np

__all__ = ["STDDEV", "draw", "sizes"]

STDDEV = 0.02  # transformers' LlamaConfig.initializer_range

# An `Architecture`'s fields as keras_hub's `LlamaBackbone` and transformers'
# `LlamaConfig` take them (None: that library has no such argument).
_ARGUMENTS = {
    "vocabulary": ("vocabulary_size", "vocab_size"),
    "layers": ("num_layers", "num_hidden_layers"),
    "query_heads": ("num_query_heads", "num_attention_heads"),
    "kv_heads": ("num_key_value_heads", "num_key_value_heads"),
    "hidden": ("hidden_dim", "hidden_size"),
    "ffn": ("intermediate_dim", "intermediate_size"),
    "context": (None, "max_position_embeddings"),
}
_LIBRARIES = ("keras_hub", "transformers")


def sizes(arch, library):
    """`arch`'s sizes as keyword arguments of `library`'s Llama.

    Args:
      arch: a `keras_arm.Architecture`.
      library: "keras_hub" (`LlamaBackbone`) or "transformers" (`LlamaConfig`).

    Example:
      >>> sizes(arch, "transformers")["num_hidden_layers"] == arch.layers
      True
    """
    column = _LIBRARIES.index(library)
    return {
        names[column]: getattr(arch, field)
        for field, names in _ARGUMENTS.items()
        if names[column] is not None
    }


def draw(arch, seed, stddev=STDDEV):
    """Initial weights of `arch` from `seed`: `{Hugging Face name: float32 array}`.

    Args:
      arch: a `keras_arm.Architecture`.
      seed: the numpy generator's seed.
      stddev: standard deviation of the linear layers and embeddings.

    Returns:
      Every parameter of transformers' `LlamaForCausalLM` of `arch` (untied
      `lm_head`), in its names and shapes, drawn in that order.
    """
    rng = np.random.default_rng(seed)
    head_dim = arch.hidden // arch.query_heads

    def normal(*shape):
        return (rng.standard_normal(shape, np.float32) * stddev).astype(np.float32)

    def ones(size):
        return np.ones((size,), np.float32)

    weights = {"model.embed_tokens.weight": normal(arch.vocabulary, arch.hidden)}
    for i in range(arch.layers):
        prefix = f"model.layers.{i}."
        weights.update(
            {
                prefix + "self_attn.q_proj.weight": normal(
                    arch.query_heads * head_dim, arch.hidden
                ),
                prefix + "self_attn.k_proj.weight": normal(
                    arch.kv_heads * head_dim, arch.hidden
                ),
                prefix + "self_attn.v_proj.weight": normal(
                    arch.kv_heads * head_dim, arch.hidden
                ),
                prefix + "self_attn.o_proj.weight": normal(
                    arch.hidden, arch.query_heads * head_dim
                ),
                prefix + "mlp.gate_proj.weight": normal(arch.ffn, arch.hidden),
                prefix + "mlp.up_proj.weight": normal(arch.ffn, arch.hidden),
                prefix + "mlp.down_proj.weight": normal(arch.hidden, arch.ffn),
                prefix + "input_layernorm.weight": ones(arch.hidden),
                prefix + "post_attention_layernorm.weight": ones(arch.hidden),
            }
        )
    weights["model.norm.weight"] = ones(arch.hidden)
    weights["lm_head.weight"] = normal(arch.vocabulary, arch.hidden)
    return weights
