"""Calibration: a model's blocks, their inputs, and what each kernel's layer reads.

One-shot pruning goes block by block, as the papers' reference code does:
a keras_hub model's decoder blocks (`backbone.transformer_layers`), or else
the model's own top-level layers that hold Dense / EinsumDense layers. The
inputs of the first block are captured once, from one pass of the model
over the calibration batches; each later block's are the outputs of the
block before, run again after it was pruned, with the other arguments each
block received in that pass (padding and attention masks). Where a block's
input is not the output of the block before (a model that does more between
blocks), the model is run again up to each block instead, which costs more
time but calibrates the same way. Only one block's inputs are held at a time.

The first pass does two more things, as the calls of keras_hub's blocks are
most of a pass's time (each op dispatched eagerly): it records what the first
block's kernels read (their inputs in that pass are the ones a separate call
would give), and it stops when the last block is called, once its arguments
are recorded, so neither the last block nor the model's head runs.
"""

import keras
import numpy as np

from maskfit import internals

__all__ = [
    "Stats",
    "batches_of",
    "block_inputs",
    "blocks",
    "chained",
    "in_one_pass",
    "kernel_layers",
    "watch",
]


class _Stop(Exception):
    """Ends a forward pass once the block of interest has its inputs."""


def _prunable(layer):
    return isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))


def kernel_layers(block):
    """The Dense / EinsumDense layers of `block` (itself included), depth first."""
    return [x for x in [block] + internals.sublayers(block) if _prunable(x)]


def blocks(model):
    """The blocks `model` is pruned in, in call order."""
    for owner in (getattr(model, "backbone", None), model):
        found = getattr(owner, "transformer_layers", None)
        if found:
            return list(found)
    top = internals.sublayers(model, recursive=False)
    return [layer for layer in top if kernel_layers(layer)]


def batches_of(calibration):
    """The model inputs of every calibration batch, as `fit` unpacks `(x, y, w)`."""
    return [keras.utils.unpack_x_y_sample_weight(data)[0] for data in calibration]


def _follows(x, last):
    """Whether a block's first argument `x` is `last`, the output of the block before."""
    if last is None:
        return False
    return x is last or np.array_equal(
        keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(last)
    )


def _run(model, x):
    """`model(x)` in inference mode, until a watched block ends the pass."""
    try:
        model(x, training=False)
    except _Stop:
        pass


def _wrap(block, record):
    original = block.call

    def call(*args, **kwargs):
        return record(original, args, kwargs)

    return internals.set_method(block, "call", call)


def chained(model, found, batches, first=None):
    """`(inputs of the first block per batch, other arguments per block and batch)`.

    One pass of `model` over `batches` with every block watched. Returns
    None for the second item if some block's first argument is not the
    output of the block before it (`block_inputs` then runs the model up to
    each block instead). The pass ends at the last block's call, once its
    arguments are recorded: neither that block nor what follows it runs.

    Args:
      model: the model.
      found: its blocks (`blocks`).
      batches: the model inputs per batch (`batches_of`).
      first: optionally `(layers, stats)`: the first block's kernel layers,
        watched in this pass (`watch`), so their `Stats` need no call of
        their own. They hold the first block's calibration only where the
        second item is not None (a block called more than once per batch
        adds every call).
    """
    firsts, rests, chain = [], [[] for _ in found], [True]
    last = [None]
    final = len(found) - 1

    def recorder(index):
        def record(original, args, kwargs):
            if not args:
                chain[0] = False
            elif index == 0:
                firsts.append(args[0])
            elif not _follows(args[0], last[0]):
                chain[0] = False
            rests[index].append((args[1:], kwargs))
            if index == final and index > 0:
                raise _Stop("the last block's arguments recorded")
            out = original(*args, **kwargs)
            last[0] = out if not isinstance(out, (tuple, list)) else None
            return out

        return record

    undo = [_wrap(block, recorder(i)) for i, block in enumerate(found)]
    if first is not None:
        undo += watch(*first)
    try:
        for x in batches:
            last[0] = None
            _run(model, x)
    finally:
        for step in reversed(undo):
            step()
    # A block called more than once per batch (shared) breaks the chain too.
    once = all(len(seen) == len(batches) for seen in rests)
    return firsts, (rests if chain[0] and once else None)


def in_one_pass(model, found, x, visit):
    """Runs `model` once on the batch `x`, each block visited as the pass reaches it.

    At a block's first call, `visit(block, args, kwargs)` runs first (it
    calibrates and prunes the block, calling `block.call` on `args` and
    `kwargs`, which then runs the block as it is); then the block runs on
    them and its output goes on. Its later calls run it as it is. The pass stops once
    the last block is visited: neither its pruned call nor the model's head
    runs.

    Returns:
      whether the blocks were chained (each called once, its first argument
      the output of the block before it, as `chained` checks), or None if a
      block was called before one listed ahead of it was visited.

    Raises:
      ValueError: if a block is never called.
    """
    seen, chain, last, order, visiting = set(), [True], [None], [True], [False]
    final = len(found) - 1

    def recorder(index):
        def record(original, args, kwargs):
            if visiting[0]:
                return original(*args, **kwargs)
            if index in seen or not order[0]:
                chain[0] = False
                return original(*args, **kwargs)
            if len(seen) != index:
                order[0] = False
                raise _Stop("a block called out of its order")
            seen.add(index)
            if not args:
                chain[0] = False
            elif index and not _follows(args[0], last[0]):
                chain[0] = False
            visiting[0] = True
            try:
                visit(found[index], args, kwargs)
            finally:
                visiting[0] = False
            if index == final:
                raise _Stop("every block visited")
            out = original(*args, **kwargs)
            last[0] = out if not isinstance(out, (tuple, list)) else None
            return out

        return record

    undo = [_wrap(block, recorder(i)) for i, block in enumerate(found)]
    try:
        _run(model, x)
    finally:
        for step in reversed(undo):
            step()
    if not order[0]:
        return None
    missing = [block.name for i, block in enumerate(found) if i not in seen]
    if missing:
        raise ValueError(
            f"prune_oneshot: block '{missing[0]}' was not called when"
            f" model '{model.name}' ran on a calibration batch."
        )
    return chain[0]


def block_inputs(model, block, batches):
    """`[(args, kwargs)]` of `block`'s call on each batch, running `model` up to it."""
    seen = []

    def record(original, args, kwargs):
        seen.append((args, kwargs))
        raise _Stop("inputs captured")

    undo = _wrap(block, record)
    try:
        for x in batches:
            count = len(seen)
            _run(model, x)
            if len(seen) == count:
                raise ValueError(
                    f"prune_oneshot: block '{block.name}' was not called when"
                    f" model '{model.name}' ran on a calibration batch."
                )
    finally:
        undo()
    return seen


class Stats:
    """What a kernel's layer read over the calibration tokens: `X^T X` and the count.

    `shared`, a dict given to the stats of layers that read the same tensor
    (keras_hub's query, key and value projections; the FFN's gate and up
    projections), holds the last input's `X^T X` per view of the input, so
    it is computed once per call rather than once per layer.
    """

    def __init__(self, view, shared=None):
        self.view = view
        self.sums = np.zeros((view.rows[0], view.rows[0]))
        self.count = 0
        self.shared = {} if shared is None else shared

    def add(self, x):
        key = (self.view.input_letters, self.view.contracted, self.view.rows[0])
        last = self.shared.get(key)
        if last is None or last[0] is not x:
            rows = self.view.inputs(keras.ops.convert_to_numpy(x))
            # `x` is held with its product, so its id cannot be reused meanwhile.
            last = self.shared[key] = (x, rows.T @ rows, len(rows))
        self.sums += last[1]
        self.count += last[2]

    @property
    def squares(self):
        """Each input feature's sum of squares (Wanda's `||X_j||^2`)."""
        return np.diag(self.sums).copy()


def watch(layers, stats):
    """Records every call of `layers[i]` into `stats[i]`; returns the undo functions."""

    def recorder(index):
        def record(original, args, kwargs):
            x = args[0] if args else kwargs.get("inputs")
            stats[index].add(x)
            return original(*args, **kwargs)

        return record

    return [_wrap(layer, recorder(i)) for i, layer in enumerate(layers)]
