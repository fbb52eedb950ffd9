"""Fine-tuning recipes as masks: BitFit, chosen variables, embedding rows, sparse, probe.

Each recipe declares `ElementMask`s (or a `PiecewiseMask`) on the layers that
own the model's trainable variables, so `MaskedModel` keeps every entry it
freezes bit-identical under any optimizer (weight decay, momentum included).
A mask of one number per variable costs no memory. Each replaces the masks
declared before on the layers it covers.
"""

import math
import numbers
import re

import keras
import numpy as np

from maskfit import internals
from maskfit.spec.declare import set_mask
from maskfit.spec.masks import ElementMask
from maskfit.spec.schedule import PiecewiseMask

__all__ = [
    "bitfit",
    "probe_then_finetune",
    "sparse_finetune",
    "train_embedding_rows",
    "train_only",
]

# Bias terms: Dense/conv/attention `bias`, normalization offsets `beta`.
BIAS_PATTERNS = (r"(^|/)bias$", r"(^|/)beta$")


def train_only(model, patterns):
    """Lets only the variables whose path matches one of `patterns` learn.

    Every other trainable variable of `model` is frozen (mask 0). Patterns are
    regular expressions searched in each variable's path (`variable.path`,
    e.g. "transformer_layer_0/self_attention/query/kernel").

    Args:
      model: a built Keras model (or layer).
      patterns: a regular expression or a list of them.

    Returns:
      The paths of the variables that learn.

    Raises:
      ValueError: when no trainable variable matches (the error lists some
        paths), or a pattern is not a valid regular expression.

    Example:

    >>> import keras, maskfit
    >>> model = keras.Sequential(
    ...     [keras.Input((3,)), keras.layers.Dense(2, name="d")], name="net")
    >>> maskfit.train_only(model, [r"d/bias$"])
    ('net/d/bias',)
    """
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    try:
        compiled = [re.compile(p) for p in patterns]
    except (re.error, TypeError) as e:
        raise ValueError(
            f"train_only expects regular expressions (strings). Received:"
            f" patterns={patterns!r} ({e})"
        ) from None
    owners = _owners(model)
    learns = {
        id(v)
        for _, variables in owners
        for v in variables
        if any(p.search(v.path) for p in compiled)
    }
    if not learns:
        paths = [v.path for _, variables in owners for v in variables][:6]
        raise ValueError(
            f"train_only expected patterns that match some trainable variable of"
            f" '{model.name}'; none of {patterns!r} matches. Its paths look like"
            f" {paths}. Received: patterns={patterns!r}"
        )
    _declare(owners, lambda v: np.float32(id(v) in learns))
    return tuple(v.path for _, vs in owners for v in vs if id(v) in learns)


def bitfit(model):
    """BitFit: only the bias terms learn (Ben Zaken et al., ACL 2022).

    The biases of every layer (`bias`) and the offsets of normalizations
    (`beta`) learn; kernels, embeddings and scales are frozen. On BERT the
    paper fine-tunes about 0.1% of the parameters and stays within about a
    point of full fine-tuning on small GLUE tasks. Add the new head with
    `train_only` patterns if it should learn entirely.

    Args:
      model: a built Keras model.

    Returns:
      The paths of the variables that learn.

    Raises:
      ValueError: when the model has no bias term.

    Example:

    >>> import keras, maskfit
    >>> model = keras.Sequential(
    ...     [keras.Input((3,)), keras.layers.Dense(2, name="d")], name="net")
    >>> maskfit.bitfit(model)
    ('net/d/bias',)
    """
    return train_only(model, BIAS_PATTERNS)


def train_embedding_rows(layer, rows):
    """Lets only some rows of an embedding learn (new tokens added to a vocabulary).

    The `embeddings` variable learns in the given rows only; the layer's other
    variables (an untied output embedding) are frozen. The rest of the model
    is left as it is: combine with `train_only` to freeze it too.

    Args:
      layer: a built embedding layer with an `embeddings` variable
        (`keras.layers.Embedding`, keras_hub's `ReversibleEmbedding`).
      rows: the token ids whose rows learn, integers in [0, vocabulary size).

    Returns:
      `layer`.

    Raises:
      ValueError: for a layer without `embeddings`, an unbuilt one, or rows
        out of range or empty.

    Example:

    >>> import keras, maskfit
    >>> embedding = keras.layers.Embedding(10, 4)
    >>> embedding.build((None,))
    >>> _ = maskfit.train_embedding_rows(embedding, [8, 9])
    >>> maskfit.get_mask(embedding).masks["embeddings"][:, 0].tolist()
    [False, False, False, False, False, False, False, False, True, True]
    """
    table = getattr(layer, "embeddings", None)
    if not layer.built or not isinstance(table, keras.Variable):
        raise ValueError(
            f"train_embedding_rows expects a built embedding layer with an"
            f" `embeddings` variable. Received: layer '{layer.name}'"
            f" ({type(layer).__name__}, built={layer.built})"
        )
    rows = np.asarray(rows)
    size = table.shape[0]
    if (
        rows.size == 0
        or rows.ndim != 1
        or not np.issubdtype(rows.dtype, np.integer)
        or rows.min() < 0
        or rows.max() >= size
    ):
        raise ValueError(
            f"train_embedding_rows expects a non-empty list of integer token ids"
            f" in [0, {size}) for layer '{layer.name}'. Received: rows={rows!r}"
        )
    keep = np.zeros((size, 1), np.float32)
    keep[rows] = 1.0
    masks = {"embeddings": keep}
    masks.update({v.path: np.float32(0) for v in layer.trainable_weights})
    masks.pop(table.path, None)
    set_mask(layer, ElementMask(masks))
    return layer


def sparse_finetune(model, x, y=None, *, k, steps, batch_size=None):
    """Sparse fine-tuning: only the `k` entries that moved most in a short pass learn.

    Lottery-ticket sparse fine-tuning (LT-SFT, Ansell et al., ACL 2022): train
    every entry for `steps` batches with the model's compiled optimizer,
    keep the `k` entries whose values changed most, reset every weight and
    the optimizer's state to where they were, and train only those (a fixed
    sparse difference from the pretrained weights, as in diff pruning, Guo et
    al. 2021). Then call `fit` as usual.

    Args:
      model: a compiled `MaskedModel`.
      x, y: the data of the short pass, as for `model.fit`.
      k: how many entries learn: an integer in [1, trainable entries], or a
        fraction in (0, 1) of them.
      steps: batches in the short pass, a positive integer.
      batch_size: as for `model.fit`.

    Returns:
      The number of entries that learn.

    Raises:
      ValueError: for `k` or `steps` out of range, or a model not compiled.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> model = maskfit.MaskedSequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile(optimizer="adamw", loss="mse")
    >>> x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
    >>> maskfit.sparse_finetune(model, x, y, k=3, steps=2, batch_size=4)
    3
    >>> maskfit.summary(model, print_fn=None).learnable_params
    3
    """
    owners = _owners(model)
    total = sum(int(np.prod(v.shape)) for _, vs in owners for v in vs)
    count = _check_k(k, total)
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(
            "sparse_finetune expects `steps`, the batches of the short pass, as a"
            f" positive integer. Received: steps={steps!r}"
        )
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"sparse_finetune expects a compiled model; '{model.name}' has no"
            " optimizer. Call model.compile(...) first."
        )
    for layer, _ in owners:  # the short pass trains every entry
        set_mask(layer, None)
    saved = model.get_weights()
    start = [v.numpy() for _, vs in owners for v in vs]
    model.fit(x, y, batch_size=batch_size, epochs=1, steps_per_epoch=steps, verbose=0)
    moved = [
        np.abs(v.numpy() - w).ravel()
        for v, w in zip([v for _, vs in owners for v in vs], start)
    ]
    flat = np.concatenate(moved)
    chosen = np.zeros(flat.size, bool)
    chosen[np.argsort(-flat, kind="stable")[:count]] = True
    model.set_weights(saved)
    _reset_optimizer(model.optimizer)
    masks, offset = {}, 0
    for _, vs in owners:
        for v in vs:
            size = int(np.prod(v.shape))
            masks[id(v)] = chosen[offset : offset + size].reshape(v.shape)
            offset += size
    _declare(owners, lambda v: masks[id(v)].astype(np.float32))
    return count


def probe_then_finetune(model, head, switch_step):
    """Linear probing, then full fine-tuning (LP-FT, Kumar et al., ICLR 2022).

    The head learns from step 0; everything else is frozen until optimizer
    step `switch_step`, then learns too. The switch is a `PiecewiseMask`, so
    it happens inside the compiled step: one `fit`, no recompiling.

    Args:
      model: a built Keras model.
      head: the head's layer, or a list of layers, inside `model`.
      switch_step: the optimizer step at which the rest starts learning, a
        positive integer.

    Returns:
      The paths of the variables that wait for `switch_step`.

    Raises:
      ValueError: for a `switch_step` out of range, or a head with no
        trainable variable of `model`.

    Example:

    >>> import keras, maskfit
    >>> head = keras.layers.Dense(2, name="head")
    >>> model = keras.Sequential(
    ...     [keras.Input((3,)), keras.layers.Dense(4, name="body"), head], name="net")
    >>> maskfit.probe_then_finetune(model, head, switch_step=100)
    ('net/body/kernel', 'net/body/bias')
    """
    if (
        isinstance(switch_step, bool)
        or not isinstance(switch_step, numbers.Integral)
        or switch_step < 1
    ):
        raise ValueError(
            "probe_then_finetune expects `switch_step` as a positive integer (the"
            f" optimizer step where full fine-tuning starts). Received:"
            f" switch_step={switch_step!r}"
        )
    heads = [head] if isinstance(head, keras.layers.Layer) else list(head)
    in_head = {id(v) for x in heads for v in getattr(x, "trainable_weights", [])}
    owners = _owners(model)
    every = {id(v) for _, vs in owners for v in vs}
    if not in_head or not in_head <= every:
        raise ValueError(
            f"probe_then_finetune expects the head as layers of '{model.name}' with"
            f" trainable variables. Received: head={head!r}"
        )
    waiting = [v for _, vs in owners for v in vs if id(v) not in in_head]
    for layer, variables in owners:
        rest = [v for v in variables if id(v) not in in_head]
        if not rest:
            set_mask(layer, None)
            continue
        before = {v.path: np.float32(id(v) in in_head) for v in variables}
        after = {v.path: np.float32(1) for v in variables}
        spec = PiecewiseMask(
            [int(switch_step)], [ElementMask(before), ElementMask(after)]
        )
        set_mask(layer, spec)
    return tuple(v.path for v in waiting)


def _check_k(k, total):
    if isinstance(k, bool) or not isinstance(k, numbers.Real) or not math.isfinite(k):
        valid = False
    elif isinstance(k, numbers.Integral):
        valid = 1 <= k <= total
    else:
        valid = 0 < k < 1
    if not valid:
        raise ValueError(
            "sparse_finetune expects `k`, the entries that learn, as an integer in"
            f" [1, {total}] (the model's trainable entries) or a fraction in (0, 1)."
            f" Received: k={k!r}"
        )
    return int(k) if isinstance(k, numbers.Integral) else max(1, round(k * total))


def _reset_optimizer(optimizer):
    """Drops the optimizer's slots and puts its step count back to 0."""
    iterations = optimizer.iterations
    internals.reset_optimizer(optimizer)
    iterations.assign(0)


def _owners(model):
    """`[(layer, variables)]`: each trainable variable under the innermost layer."""
    layers = [model] + internals.sublayers(model)
    owner = {}
    for layer in layers:
        for v in layer.trainable_weights:
            best = owner.get(id(v))
            if best is None or len(layer.trainable_weights) < len(
                best[0].trainable_weights
            ):
                owner[id(v)] = (layer, v)
    found = {}
    for layer, v in owner.values():
        found.setdefault(id(layer), (layer, []))[1].append(v)
    return list(found.values())


def _declare(owners, mask_of):
    """An ElementMask `{path: mask_of(variable)}` on each owning layer."""
    for layer, variables in owners:
        set_mask(layer, ElementMask({v.path: mask_of(v) for v in variables}))
