"""`prune_oneshot`: a trained model pruned at once from calibration batches, block by block."""

import time

import keras
import numpy as np

from maskfit import checks
from maskfit.oneshot import calibrate, report, sparsegpt, targets, views, wanda
from maskfit.spec import declare
from maskfit.spec import masks as specs

__all__ = ["prune_oneshot"]


def prune_oneshot(
    model,
    calibration,
    method="sparsegpt",
    sparsity=None,
    pattern=None,
    *,
    blocksize=128,
    percdamp=0.01,
):
    """Prunes every Dense / EinsumDense kernel of `model`'s blocks at once, and masks the zeros.

    The post-training pruning of language models (Wanda, SparseGPT), on any
    Keras model: a keras_hub causal LM's decoder blocks, or the top-level
    layers of another model that hold Dense / EinsumDense layers. Blocks are
    pruned in order, each calibrated on the outputs of the blocks already
    pruned (the papers' sequential scheme); within a block every kernel is
    calibrated on the block's inputs, then all are pruned. Each pruned layer
    gets an `ElementMask` freezing its zeros, so a later `fit` of a
    `MaskedModel` (healing, LoRA or full) keeps them exactly 0.

    - `"magnitude"`: the smallest `|W|` of each layer.
    - `"wanda"`: the smallest `|W_ij| * ||X_j||_2` of each output (Sun et al.
      2023); no weight moves.
    - `"sparsegpt"`: Frantar & Alistarh 2023's column-wise pruning with the
      inverse-Hessian update of the weights that stay (`blocksize`,
      `percdamp`, lazy batch updates), as its reference code.

    With `pattern="N:M"`, N of every M consecutive inputs of each output go
    (2:4 is what sparse tensor cores run); with `sparsity=s`, `int(s * n)` of
    each group a method compares (a layer, an output, a SparseGPT column
    block of n entries). Layers that cannot be pruned (LoRA enabled,
    quantized, never called, an N:M pattern that does not divide their
    inputs) are left dense and named in the report's `refused`. The math is
    NumPy (float64), the calibration passes run the model through Keras, so
    TensorFlow and JAX prune alike. With one calibration batch (the papers'
    128 sequences in one batch), one pass of the model does it all: each
    block is calibrated and pruned when the pass reaches it, then run pruned
    (two calls of each block); with several, the blocks are called once more
    each. Memory: one block's inputs and its kernels' `X^T X` at a time, and
    a copy of the pruned kernels to put back if the call fails.

    Args:
      model: a built Keras model (a keras_hub `CausalLM`, its backbone, or
        any model whose prunable layers are Dense / EinsumDense).
      calibration: an iterable of batches as `fit` takes them (inputs, or
        `(inputs, targets)` tuples), e.g. 128 windows of token ids in batches.
      method: "magnitude", "wanda" or "sparsegpt".
      sparsity: the fraction of each kernel pruned, in (0, 1).
      pattern: "N:M" instead of `sparsity`, e.g. "2:4" or "4:8".
      blocksize: SparseGPT's column block (a multiple of M).
      percdamp: SparseGPT's damping, a fraction of the Hessian's mean diagonal.

    Returns:
      a `maskfit.oneshot.OneShotReport`.

    Raises:
      ValueError: for a bad method, sparsity, pattern, blocksize or percdamp,
        an empty `calibration`, or a model with no layer to prune (the
        message names each layer found and why it was refused).
      TypeError: if `model` is not a Keras model or `calibration` is not
        iterable.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
    ...                           keras.layers.Dense(4)])
    >>> x = np.random.default_rng(0).normal(size=(4, 32, 8)).astype("float32")
    >>> found = maskfit.prune_oneshot(model, list(x), "sparsegpt", pattern="2:4")
    >>> found.sparsity, [row.layer for row in found.layers]
    (0.5, ['sequential/dense', 'sequential/dense_1'])
    >>> type(maskfit.get_mask(model.layers[0])).__name__
    'ElementMask'
    """
    start = time.perf_counter()
    goal = targets.target(method, sparsity, pattern, blocksize)
    if not checks.is_real(percdamp) or not 0.0 <= float(percdamp) < 1.0:
        raise ValueError(
            "prune_oneshot: percdamp must be a fraction in [0, 1) of the Hessian's"
            f" mean diagonal (0.01 in the paper). Received: percdamp={percdamp!r}"
        )
    if not isinstance(model, keras.Model) or not model.built:
        raise TypeError(
            "prune_oneshot expects a built keras.Model (call it on data or"
            f" build it first). Received: {model!r}"
        )
    batches = _batches(calibration)
    found = calibrate.blocks(model)
    plans, refused = _plan(found, goal)
    if not any(plans):
        raise ValueError(
            f"prune_oneshot: model '{model.name}' has no Dense or EinsumDense layer"
            " it can prune" + _reasons(refused)
        )
    state = _State(goal, (blocksize, percdamp), dict(refused))
    try:
        chained = None
        if len(batches) == 1:
            chained = _in_one_pass(model, found, plans, batches[0], state)
            if chained is None:  # blocks not called in their order: as below
                state.restore()
                state = _State(goal, (blocksize, percdamp), dict(refused))
        if chained is None:
            chained = _in_passes(model, found, plans, batches, state)
    except BaseException:
        state.restore()
        raise
    for layer, keep in state.masks.values():
        _declare(layer, keep)
    return report.OneShotReport(
        method=goal.method,
        target=goal.describe(),
        layers=tuple(state.rows),
        refused=state.refused,
        blocks=len(found),
        tokens=state.tokens[0] if state.tokens else 0,
        chained=chained,
        seconds=time.perf_counter() - start,
    )


class _State:
    """What a pass has pruned so far: reports, masks, refusals, kernels to put back."""

    def __init__(self, goal, settings, refused):
        self.goal, self.settings, self.refused = goal, settings, refused
        self.originals, self.masks, self.rows, self.tokens = {}, {}, [], []

    def prune(self, block, plan, stats):
        self.rows += _prune_block(
            block,
            plan,
            stats,
            self.goal,
            self.settings,
            (self.originals, self.masks),
            self.refused,
            self.tokens,
        )

    def restore(self):
        """Puts back every kernel pruned so far."""
        for variable, value in self.originals.values():
            variable.assign(value)


def _in_one_pass(model, found, plans, batch, state):
    """Prunes every block in one pass of `model` over its one calibration `batch`.

    Each block is calibrated and pruned when the pass reaches it, then run
    pruned, so the blocks after it read the pruned outputs (two calls of
    each block, one of the last). Returns whether the blocks were chained,
    or None, having pruned what it reached, if a block was called before one
    listed ahead of it (the passes of `_in_passes` then prune in list order).
    """
    index = {id(block): i for i, block in enumerate(found)}

    def visit(block, args, kwargs):
        plan = plans[index[id(block)]]
        # `block.call` looked up when called: a block that is a kernel's layer
        # itself is watched through it.
        stats = _calibrate(lambda *a, **k: block.call(*a, **k), plan, [(args, kwargs)])
        state.prune(block, plan, stats)

    return calibrate.in_one_pass(model, found, batch, visit)


def _in_passes(model, found, plans, batches, state):
    """Prunes every block, each calibrated on all `batches`; returns whether chained."""
    # The first block's kernels are calibrated in the model's pass itself.
    stats = _stats(plans[0])
    first = ([layer for layer, _ in plans[0]], stats)
    firsts, rests = calibrate.chained(model, found, batches, first)
    xs = firsts if rests else None
    for index, (block, plan) in enumerate(zip(found, plans)):
        if rests is not None:
            inputs = [((x,) + a, k) for x, (a, k) in zip(xs, rests[index])]
        else:
            inputs = calibrate.block_inputs(model, block, batches)
        if index or rests is None:
            stats = _calibrate(block, plan, inputs)
        state.prune(block, plan, stats)
        if rests is not None and index + 1 < len(found):
            xs = [block(*a, **k) for a, k in inputs]
        del inputs
    return rests is not None


def _batches(calibration):
    try:
        batches = calibrate.batches_of(calibration)
    except TypeError as error:
        raise TypeError(
            "prune_oneshot: calibration must be an iterable of batches (a list of"
            " inputs, a tf.data.Dataset, (x, y) tuples as fit takes them)."
            f" Received: {type(calibration).__name__}"
        ) from error
    if not batches:
        raise ValueError(
            "prune_oneshot: calibration has no batch; pass at least one batch of"
            " inputs (the papers use 128 sequences)."
        )
    return batches


def _path(layer):
    return getattr(layer, "path", None) or layer.name


def _plan(found, goal):
    """Per block, `[(layer, view)]` of the kernels to prune; refusals by layer path."""
    plans, refused = [], {}
    for block in found:
        plan = []
        for layer in calibrate.kernel_layers(block):
            view = views.kernel_view(layer)
            existing = declare.get_mask(layer)
            if isinstance(view, str):
                refused[_path(layer)] = view
            elif existing is not None and not isinstance(existing, specs.ElementMask):
                refused[_path(layer)] = (
                    f"it has a {type(existing).__name__} already; remove it"
                    " (set_mask(layer, None)) to prune the layer"
                )
            elif goal.m and view.rows[0] % goal.m:
                refused[_path(layer)] = (
                    f"pattern {goal.pattern} needs its inputs (in={view.rows[0]}"
                    f" of its (in, out) = {view.rows}) to be a multiple of {goal.m}"
                )
            else:
                plan.append((layer, view))
        plans.append(plan)
    return plans, refused


def _reasons(refused):
    if not refused:
        return ": it has none (nor a keras_hub backbone's transformer_layers)."
    return ": " + "; ".join(f"'{k}': {v}" for k, v in refused.items()) + "."


def _stats(plan):
    """Empty `Stats` for `plan`'s kernels; layers reading one tensor share its X^T X."""
    shared = {}
    return [calibrate.Stats(view, shared) for _, view in plan]


def _calibrate(call, plan, inputs):
    """The `Stats` of `plan`'s kernels over one `call` (a block) per `(args, kwargs)`."""
    stats = _stats(plan)
    undo = calibrate.watch([layer for layer, _ in plan], stats)
    try:
        for args, kwargs in inputs:
            call(*args, **kwargs)
    finally:
        for step in reversed(undo):
            step()
    return stats


def _prune_block(block, plan, stats, goal, settings, state, refused, tokens):
    """Prunes `plan`'s kernels of `block` from their `stats`; returns their `LayerReport`s."""
    blocksize, percdamp = settings
    originals, masks = state
    if stats:
        stats[0].shared.clear()  # the last inputs, held for sharing only
    rows = []
    for (layer, view), stat in zip(plan, stats):
        if stat.count == 0:
            refused[_path(layer)] = (
                f"it was not called when block '{block.name}' ran on the calibration"
                " batches"
            )
            continue
        tokens.append(stat.count)
        began = time.perf_counter()
        variable = view.variable
        weights = view.matrix(keras.ops.convert_to_numpy(variable))
        if goal.method == "magnitude":
            new, pruned = wanda.magnitude(weights, goal)
        elif goal.method == "wanda":
            new, pruned = wanda.wanda(weights, stat.squares, goal)
        else:
            H = sparsegpt.hessian(stat.sums, stat.count)
            try:
                new, pruned, _ = sparsegpt.prune(weights, H, goal, blocksize, percdamp)
            except np.linalg.LinAlgError:
                refused[_path(layer)] = (
                    "its damped Hessian is not positive definite; raise percdamp"
                )
                continue
        originals.setdefault(
            id(variable), (variable, keras.ops.convert_to_numpy(variable))
        )
        variable.assign(
            keras.ops.convert_to_tensor(view.kernel(new), dtype=variable.dtype)
        )
        keep = view.kernel(~pruned).astype("float32")
        masks[id(layer)] = (layer, keep)
        difference = weights - new
        scale = float(np.sum(weights * (stat.sums @ weights)))
        error = float(np.sum(difference * (stat.sums @ difference))) / max(
            scale, 1e-300
        )
        rows.append(
            report.LayerReport(
                layer=_path(layer),
                kernel=variable.path,
                shape=view.shape,
                matrix=view.rows,
                pruned=int(pruned.sum()),
                size=int(pruned.size),
                error=error,
                seconds=time.perf_counter() - began,
            )
        )
    return rows


def _declare(layer, keep):
    """Sets `layer`'s ElementMask to freeze its pruned kernel entries (kept with others)."""
    existing = declare.get_mask(layer)
    found = dict(existing.masks) if existing is not None else {}
    if "kernel" in found:
        keep = keep * np.broadcast_to(found["kernel"], keep.shape)
    found["kernel"] = keep
    scale = existing.scale if existing is not None else "step"
    declare.set_mask(layer, specs.ElementMask(found, scale=scale))
