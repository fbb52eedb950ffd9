"""The Torch-Pruning arm: Hugging Face's Llama, pruned as Torch-Pruning's LLM example does.

`LlamaForCausalLM` built from a `LlamaConfig` of the same `Architecture`
(no download), starting from the same initial weights as the Keras arm
(`weights.draw`, already in transformers' names and layout), trained with the same AdamW numbers on the same windows in
the same order, pruned in one shot by `torch_pruning.pruner.BasePruner`
with the settings of `examples/LLMs/prune_llm.py` (`GroupMagnitudeImportance
(p=2, group_reduction="mean")`, local pruning, `num_heads` of q/k/v,
`prune_num_heads=True`, `prune_head_dims=False`, `head_pruning_ratio` =
`pruning_ratio`, `round_to=4`), then the config updated as the example
does. One difference: the example also prunes the hidden size; both arms
here keep it (heads and FFN units only), so the embeddings, `lm_head` and
the residual stream's producers (`o_proj`, `down_proj`) are ignored as
roots (their input channels still go with the heads and FFN units).

torch, transformers and torch-pruning are the `benchmark` extra; `missing()`
says what is not installed, and the experiment skips this arm then.
"""

import importlib
import os

import numpy as np

from experiments.transformer_pruning import weights as weights_lib

__all__ = [
    "build",
    "inference",
    "missing",
    "parameters",
    "perplexity",
    "prune",
    "train",
    "versions",
]


def missing():
    """The benchmark packages that cannot be imported (empty when all are there)."""
    os.environ.setdefault("USE_TF", "0")  # transformers need not load TensorFlow
    absent = []
    for name in ("torch", "transformers", "torch_pruning"):
        try:
            importlib.import_module(name)
        except ImportError:
            absent.append(name)
    return absent


def versions():
    import torch
    import torch_pruning
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_pruning": getattr(torch_pruning, "__version__", "unknown"),
    }


def build(arch, seed, values=None):
    """A `LlamaForCausalLM` of `arch` holding `values` (`weights.draw(arch, seed)` if None)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        **weights_lib.sizes(arch, "transformers"),
        rms_norm_eps=1e-6,  # keras_hub's layer_norm_epsilon (set alike there)
        rope_theta=10000.0,  # keras_hub's rope_max_wavelength
        tie_word_embeddings=False,
        initializer_range=weights_lib.STDDEV,
    )
    model = LlamaForCausalLM(config)
    if values is None:
        values = weights_lib.draw(arch, seed)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in values.items()}
    model.load_state_dict(state, strict=True)
    return model


def parameters(model):
    return int(sum(p.numel() for p in model.parameters()))


def _loss(model, windows):
    import torch
    import torch.nn.functional as F

    tokens = torch.as_tensor(np.asarray(windows, np.int64))
    logits = model(tokens[:, :-1]).logits
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )


def train(model, batches, optimizer):
    """Trains on `batches` (`(steps, batch, length + 1)`) in order, AdamW."""
    import torch

    model.train()
    adamw = torch.optim.AdamW(
        model.parameters(),
        lr=optimizer.learning_rate,
        betas=(optimizer.beta_1, optimizer.beta_2),
        eps=optimizer.epsilon,
        weight_decay=optimizer.weight_decay,
    )
    for windows in batches:
        adamw.zero_grad(set_to_none=True)
        _loss(model, windows).backward()
        adamw.step()
    model.eval()


def perplexity(model, windows, batch_size=32):
    """exp(mean next-token cross-entropy) over `windows`."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(windows), batch_size):
            part = windows[start : start + batch_size]
            total += float(_loss(model, part)) * part[:, 1:].size
            count += part[:, 1:].size
    return float(np.exp(total / count))


def prune(model, fraction, round_to=4):
    """Prunes heads and FFN units of `model` in place, as Torch-Pruning's LLM example."""
    import torch
    import torch_pruning as tp

    config = model.config
    num_heads = {}
    ignored = [model.lm_head, model.model.embed_tokens]
    for layer in model.model.layers:
        attention = layer.self_attn
        num_heads[attention.q_proj] = config.num_attention_heads
        num_heads[attention.k_proj] = config.num_key_value_heads
        num_heads[attention.v_proj] = config.num_key_value_heads
        ignored += [attention.o_proj, layer.mlp.down_proj]
    grouped = config.num_attention_heads != config.num_key_value_heads
    example = torch.zeros((1, 8), dtype=torch.long)
    pruner = tp.pruner.BasePruner(
        model,
        example_inputs=example,
        importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        global_pruning=False,
        output_transform=lambda out: out.logits,
        pruning_ratio=fraction,
        ignored_layers=ignored,
        num_heads=num_heads,
        prune_num_heads=True,
        prune_head_dims=False,
        head_pruning_ratio=fraction,
        round_to=round_to,
    )
    for group in pruner.step(interactive=True):
        group.prune()
    # What the example does after pruning: the modules and config follow the weights.
    for layer in model.model.layers:
        attention = layer.self_attn
        heads = attention.q_proj.out_features // attention.head_dim
        config.num_attention_heads = heads
        if not grouped:
            config.num_key_value_heads = heads
        for name in ("num_heads", "num_key_value_heads"):
            if hasattr(attention, name):
                setattr(
                    attention,
                    name,
                    heads
                    if not grouped or name == "num_heads"
                    else getattr(attention, name),
                )
        if hasattr(attention, "num_key_value_groups"):
            attention.num_key_value_groups = heads // config.num_key_value_heads
        config.intermediate_size = layer.mlp.gate_proj.out_features
    model.eval()
    return model


def inference(model, batch, length, seed=0):
    """A callable running `model` on one fixed batch of token windows (logits)."""
    import torch

    rng = np.random.default_rng(seed)
    tokens = torch.as_tensor(rng.integers(0, model.config.vocab_size, (batch, length)))
    model.eval()

    def call():
        with torch.inference_mode():
            return model(tokens).logits

    call()
    return call
