"""The maskfit arm: a keras_hub Llama trained, pruned, healed and shrunk.

`build` makes the causal LM from `Architecture` (no preset, no download)
and gives it the initial weights both arms share (`weights.draw`, put in
keras_hub's layout by `keras_weights`);
`train` fits it on windows of byte tokens in the order given; `prune_one_shot`
chooses the units of a trained copy with `maskfit.pruning.select_units` and
shrinks it before healing, `prune_gradual` prunes inside `fit` with
`maskfit.pruning.prune_units` on a `PolynomialDecay` and shrinks after.
Both shrink with `uniform=True`: the result is keras_hub's own class (a
Llama with fewer heads comes back as its exact Mistral twin).
"""

import dataclasses
import math

import keras
import keras_hub
import numpy as np
import tensorflow as tf

import maskfit
from experiments.transformer_pruning import weights as weights_lib

__all__ = [
    "IMPORTANCES",
    "Architecture",
    "assign",
    "build",
    "clone",
    "hf_weights",
    "importance",
    "keras_weights",
    "model_inputs",
    "perplexity",
    "prune_gradual",
    "prune_one_shot",
    "train",
]

IMPORTANCES = ("magnitude", "taylor", "activation")


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A Llama causal LM's sizes (both arms build the same one)."""

    layers: int = 4
    hidden: int = 128
    query_heads: int = 4
    kv_heads: int = 4
    ffn: int = 344
    context: int = 128
    vocabulary: int = 256


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """AdamW with a constant learning rate (the same numbers in both arms)."""

    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-8


def build(arch, seed, initial=True):
    """A fresh `LlamaCausalLM` (no preprocessor) of `arch`.

    With `initial`, its weights are `weights.draw(arch, seed)`, the ones the
    PyTorch arm starts from too; else keras_hub's initializers' (seeded).
    """
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.LlamaBackbone(
        **weights_lib.sizes(arch, "keras_hub"),
        rope_max_wavelength=10000,  # transformers' rope_theta
        layer_norm_epsilon=1e-6,  # transformers' rms_norm_eps (set alike there)
    )
    lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    if initial:
        assign(lm, keras_weights(weights_lib.draw(arch, seed), arch))
    return lm


def _layouts(arch):
    """`[(keras_hub path, Hugging Face name, transposed, heads)]`.

    A transposed weight is an `nn.Linear`'s `(out, in)`: keras_hub holds its
    transpose `(in, out)`. `heads`, where keras_hub splits the heads out, is
    `(in axes, out axes)`: the kernel's shape is their concatenation.
    """
    head_dim = arch.hidden // arch.query_heads
    out = [
        ("token_embedding/embeddings", "model.embed_tokens.weight", False, None),
        ("token_embedding/reverse_embeddings", "lm_head.weight", True, None),
        ("sequence_output_layernorm/scale", "model.norm.weight", False, None),
    ]
    for i in range(arch.layers):
        hf, k = f"model.layers.{i}.", f"transformer_layer_{i}/"
        attention = k + "self_attention/"
        out += [
            (
                attention + kernel + "/kernel",
                hf + f"self_attn.{name}_proj.weight",
                True,
                ((arch.hidden,), (count, head_dim)),
            )
            for name, kernel, count in (
                ("q", "query", arch.query_heads),
                ("k", "key", arch.kv_heads),
                ("v", "value", arch.kv_heads),
            )
        ]
        out.append(
            (
                attention + "attention_output/kernel",
                hf + "self_attn.o_proj.weight",
                True,
                ((arch.query_heads, head_dim), (arch.hidden,)),
            )
        )
        out += [
            (k + dense + "/kernel", hf + f"mlp.{name}_proj.weight", True, None)
            for name, dense in (
                ("gate", "feedforward_gate_dense"),
                ("up", "feedforward_intermediate_dense"),
                ("down", "feedforward_output_dense"),
            )
        ]
        out += [
            (
                k + "self_attention_layernorm/scale",
                hf + "input_layernorm.weight",
                False,
                None,
            ),
            (
                k + "feedforward_layernorm/scale",
                hf + "post_attention_layernorm.weight",
                False,
                None,
            ),
        ]
    return out


def keras_weights(hf_weights, arch):
    """Hugging Face Llama weights (`weights.draw`'s) as `{keras_hub variable path: array}`.

    An `nn.Linear` weight is `(out, in)`; keras_hub's EinsumDense kernels are
    `(in, out)`, with the heads split out: query/key/value `(hidden, heads,
    head_dim)`, attention output `(heads, head_dim, hidden)`. The untied
    output projection is `reverse_embeddings`, `lm_head`'s transpose. (As
    keras_hub's own converter, `utils/transformers/convert_llama3.py`.)
    """
    out = {}
    for path, name, transposed, heads in _layouts(arch):
        value = hf_weights[name].T if transposed else hf_weights[name]
        out[path] = value if heads is None else value.reshape(heads[0] + heads[1])
    return out


def assign(lm, values):
    """Sets every weight of `lm` from `{variable path: array}` (all of them, exactly)."""
    paths = [w.path for w in lm.weights]
    if sorted(paths) != sorted(values):
        raise ValueError(
            "Received weights that do not match the model's, expected its"
            f" variables {sorted(paths)}. Received: {sorted(values)}"
        )
    for variable in lm.weights:
        variable.assign(np.ascontiguousarray(values[variable.path]))


def hf_weights(lm, arch):
    """`lm`'s weights in Hugging Face's names and layout: `keras_weights` inverted."""
    values = {w.path: np.asarray(w) for w in lm.weights}
    out = {}
    for path, name, transposed, heads in _layouts(arch):
        value = values[path]
        if heads is not None:
            value = value.reshape(math.prod(heads[0]), math.prod(heads[1]))
        out[name] = value.T if transposed else value
    return {name: np.ascontiguousarray(value) for name, value in out.items()}


def clone(lm, arch, seed):
    """A new causal LM of `arch` holding `lm`'s weights."""
    copy = build(arch, seed, initial=False)
    copy.set_weights(lm.get_weights())
    return copy


def model_inputs(windows):
    """`(x, y)` of windows of `length + 1` tokens: the first `length`, the next ones."""
    tokens = np.asarray(windows[:, :-1], np.int32)
    x = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
    return x, np.asarray(windows[:, 1:], np.int32)


class TorchAdamW(keras.optimizers.AdamW):
    """Keras's AdamW taking the steps `torch.optim.AdamW` takes.

    Two differences, each measured at the first step from the same weights
    on the same batch (the arms' dense models otherwise drift apart):

    - Dense gradients. The token embedding's gradient reaches the optimizer
      as `tf.IndexedSlices`, one slice per occurrence of a token. Keras's
      Adam squares the slices before it scatter-adds them into its second
      moment, so a row gets the sum of its occurrences' squared gradients,
      not the square of their sum, and a frequent token's row (the space
      byte) steps up to sqrt(occurrences) times the learning rate. The
      slices are summed into a dense gradient first, as PyTorch's embedding
      gradient is.
    - Where epsilon goes. Keras adds it to sqrt(v) before the bias correction
      of v, PyTorch after: Keras's epsilon is in effect PyTorch's divided by
      sqrt(1 - beta_2^t) (31.6x at the first step), which shortens the first
      steps of small-gradient weights. Here it is scaled by
      sqrt(1 - beta_2^t), which gives PyTorch's update exactly.
    """

    def apply(self, grads, trainable_variables=None):
        grads = [
            tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
            for g in grads
        ]
        return super().apply(grads, trainable_variables)

    def update_step(self, gradient, variable, learning_rate):
        step = keras.ops.cast(self.iterations + 1, variable.dtype)
        beta_2 = keras.ops.cast(self.beta_2, variable.dtype)
        epsilon = self.epsilon
        self.epsilon = epsilon * keras.ops.sqrt(1 - keras.ops.power(beta_2, step))
        try:
            super().update_step(gradient, variable, learning_rate)
        finally:
            self.epsilon = epsilon


def _compile(model, optimizer, run_eagerly=False):
    model.compile(
        optimizer=TorchAdamW(
            learning_rate=optimizer.learning_rate,
            weight_decay=optimizer.weight_decay,
            beta_1=optimizer.beta_1,
            beta_2=optimizer.beta_2,
            epsilon=optimizer.epsilon,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=run_eagerly,
    )


def train(model, batches, optimizer, run_eagerly=False):
    """Fits `model` on `batches` (`(steps, batch, length + 1)`), in that order.

    Returns the mean loss of the last tenth of the steps.
    """
    _compile(model, optimizer, run_eagerly)
    steps, batch = batches.shape[:2]
    x, y = model_inputs(batches.reshape(steps * batch, -1))
    history = model.fit(x, y, batch_size=batch, shuffle=False, epochs=1, verbose=0)
    del history
    return None


def perplexity(model, windows, batch_size=32):
    """exp(mean next-token cross-entropy) over `windows`."""
    x, y = model_inputs(windows)
    total = 0.0
    for start in range(0, len(y), batch_size):
        part = {k: v[start : start + batch_size] for k, v in x.items()}
        logits = np.asarray(model(part, training=False), np.float64)
        logits -= logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        target = y[start : start + batch_size]
        total -= np.take_along_axis(log_probs, target[..., None], -1).sum()
    return float(np.exp(total / y.size))


def importance(name, model, calibration):
    """The maskfit importance called `name`, calibrated on `calibration` windows."""
    if name == "magnitude":
        return maskfit.pruning.MagnitudeImportance(p=2)
    if name == "taylor":
        return maskfit.pruning.TaylorImportance()
    if name == "activation":
        x, _ = model_inputs(calibration)
        return maskfit.pruning.ActivationImportance().calibrate(model, x, batch_size=8)
    raise ValueError(
        f"Received an unknown importance, expected one of {IMPORTANCES}."
        f" Received: {name!r}"
    )


def prune_one_shot(model, name, fraction, calibration, round_to):
    """Chooses the units of trained `model` at once; returns the shrunk model."""
    scores = importance(name, model, calibration)
    x, y = model_inputs(calibration)
    selection = maskfit.pruning.select_units(
        model,
        fraction,
        importance=scores,
        round_to=round_to,
        data=(x, y),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        batch_size=8,
    )
    return maskfit.pruning.shrink(model, selection, uniform=True)


def prune_gradual(
    model,
    name,
    fraction,
    calibration,
    round_to,
    heal,
    optimizer,
    updates,
    run_eagerly=False,
):
    """Prunes `model` while it trains on `heal` (to `fraction` by half of it); shrinks.

    The fraction grows in `updates` equal steps over the first half of the
    steps (`PolynomialDecay`, power 3, as TF-MOT's default schedule shapes it),
    then the pruned model trains on; returns the shrunk model.
    """
    steps = heal.shape[0]
    end = max(1, steps // 2)
    frequency = max(1, end // updates)
    schedule = maskfit.pruning.PolynomialDecay(
        0.0, fraction, begin_step=0, end_step=end, frequency=frequency
    )
    pruned = maskfit.pruning.prune_units(
        model,
        schedule,
        importance=importance(name, model, calibration),
        round_to=round_to,
    )
    train(pruned, heal, optimizer, run_eagerly)
    return maskfit.pruning.shrink(pruned, uniform=True)
