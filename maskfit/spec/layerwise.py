"""Layer-wise learning-rate decay: each block learns at decay**depth from the output."""

import math
import numbers
import typing

import keras
import numpy as np

from maskfit import internals
from maskfit.spec import depth as depth_lib
from maskfit.spec import stacks as stacks_lib
from maskfit.spec.declare import get_mask, set_mask
from maskfit.spec.masks import ElementMask, OutputMask
from maskfit.spec.schedule import PiecewiseMask

__all__ = ["LayerwiseBlock", "LayerwisePlan", "layerwise_decay", "layerwise_depths"]

# On a layer: (the spec layerwise_decay declared, the spec it multiplied), so
# that calling it again replaces its own factor instead of compounding it.
_DECLARED_ATTR = "_maskfit_layerwise_decay"


class LayerwiseBlock(typing.NamedTuple):
    """One block and the multiplier `layerwise_decay` declared on it.

    Attributes:
      depth: 0 for the block nearest the output.
      multiplier: `decay ** depth`.
      start: the optimizer step from which it learns (0 without unfreezing).
      layers: the names of its layers.
      params: how many trainable entries its layers hold.
      rule: what placed these layers in one block: "cut" (every path from
        the inputs passes through it), "cut of <inputs>" (one stack of an
        encoder-decoder: every path from those inputs passes through it),
        "leading embeddings", "sublayer of <layer>", "in <nested model>: ...",
        "after the last cut", "given" (a list of blocks); "+ norms" when
        blocks of vectors joined it, and the shared layers placed at their
        first use.

    Example:

    >>> import keras, maskfit
    >>> model = keras.Sequential([keras.Input((3,)),
    ...     keras.layers.Dense(4, name="a"), keras.layers.Dense(2, name="b")])
    >>> block = maskfit.layerwise_depths(model, 0.5)[1]
    >>> block.depth, block.multiplier, block.layers, block.params
    (1, 0.5, ('a',), 16)
    """

    depth: int
    multiplier: float
    start: int
    layers: tuple
    params: int = 0
    rule: str = ""


class LayerwisePlan(tuple):
    """The `LayerwiseBlock`s of a model, the output's first; prints as a table.

    A tuple, so `plan[0]` is the head's block; `str(plan)` (or `print(plan)`)
    lists each block's depth, multiplier, first step, entries and layers, for a
    check before training.

    Example:

    >>> import keras, maskfit
    >>> model = keras.Sequential([keras.Input((3,)),
    ...     keras.layers.Dense(4, name="a"), keras.layers.Dense(2, name="b")])
    >>> plan = maskfit.layerwise_depths(model, 0.5)
    >>> [(block.depth, block.layers) for block in plan]
    [(0, ('b',)), (1, ('a',))]
    """

    def __str__(self):
        rows = [("depth", "multiplier", "from step", "params", "placed by", "layers")]
        rows += [
            (
                str(b.depth),
                f"{b.multiplier:.4g}",
                str(b.start),
                f"{b.params:,}",
                b.rule,
                ", ".join(b.layers),
            )
            for b in self
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        return "\n".join(
            "  ".join(cell.rjust(w) for cell, w in zip(row[:4], widths))
            + f"  {row[4].ljust(widths[4])}  {row[5]}"
            for row in rows
        )

    def __repr__(self):
        return f"LayerwisePlan({list(self)!r})"


def layerwise_depths(model, decay=1.0, unfreeze_every=None, *, stacks="sequential"):
    """Returns what `layerwise_decay(model, decay, unfreeze_every)` would declare.

    Nothing is declared: print the result to check the depth given to each
    layer before training (see `layerwise_decay` for how it is found).

    Args:
      model: as for `layerwise_decay`.
      decay: as for `layerwise_decay`; 1.0 (the default) to see depths only.
      unfreeze_every: as for `layerwise_decay`.
      stacks: as for `layerwise_decay`.

    Returns:
      A `LayerwisePlan`: the `LayerwiseBlock`s, the output's first.

    Raises:
      ValueError, TypeError: as `layerwise_decay`.

    Example:

    >>> import keras, maskfit
    >>> inputs = keras.Input((4,))
    >>> stem = keras.layers.Dense(6, name="stem")(inputs)
    >>> skip = keras.layers.Add()([stem, keras.layers.Dense(6, name="body")(stem)])
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(skip))
    >>> print(maskfit.layerwise_depths(model, 0.5))
    depth  multiplier  from step  params  placed by  layers
        0           1          0      14  cut        head
        1         0.5          0      42  cut        body
        2        0.25          0      30  cut        stem
    """
    return _plan_blocks(model, decay, unfreeze_every, stacks)[0]


def layerwise_decay(model, decay, unfreeze_every=None, *, stacks="sequential"):
    """Declares learning-rate multipliers `decay ** depth`, depth counted from the output.

    Discriminative fine-tuning (ULMFiT's per-layer learning rates; layer-wise
    learning-rate decay in BEiT or ELECTRA fine-tuning, 0.65-0.9 per block):
    the block nearest the output learns at the optimizer's learning rate,
    the one below at `decay` times it, the next at `decay**2`... Each block's
    trainable variables get an `ElementMask` of one number each (a scalar:
    no memory), which the masked training step turns into the learning rate
    of those variables.

    With `unfreeze_every=k`, the block at depth d is also frozen (mask 0)
    until optimizer step `d * k` (gradual unfreezing: the head first, one
    block more every k steps), through a `PiecewiseMask`.

    A mask already declared on a layer is multiplied (interval by interval,
    for a `PiecewiseMask`), so a warm-in schedule you declared first (0, then
    0.1, then 1) composes with the decay. Calling it again replaces the
    factor it declared before instead of compounding it. An `OutputMask`
    cannot carry a per-variable factor (its shared entries stay at 1), so a
    layer carrying one is refused.

    Depth is found in any built Sequential or functional model, nested
    models and keras_hub backbones included (`maskfit.spec.depth`): the graph
    is cut where every path from an input to the outputs passes through one
    call, and the layers between two cuts are one block (a residual block,
    a transformer layer, the embeddings summed before the first layer);
    a nested model counts its own blocks; a block of vectors only (a
    normalization) joins the one before it. A model with several stacks
    gets one depth per layer of each: in an encoder-decoder, each encoder
    layer and each decoder layer (`stacks`). A tensor read again by later
    layers (the encoder's output read by every cross-attention, a shared
    relative-position table) does not tie them together: a shared piece
    gets the depth of its first use. `layerwise_depths` shows the result,
    with the rule that placed each block, without declaring anything.

    Args:
      model: a built `keras.Sequential` or functional model, or a list of
        blocks, input side first, each a layer or a list of layers (the last
        block is at depth 0), for a subclassed model or another grouping.
      decay: the factor per block, in (0, 1].
      unfreeze_every: optimizer steps between two blocks' unfreezing, a
        positive integer; None (the default) trains every block from step 0.
      stacks: how the stacks of a model with several are ordered (a model
        only). "sequential" (the default): one depth per block, a stack
        that another reads below it (embeddings < encoder 0 < ... <
        encoder n < decoder 0 < ... < decoder m < head; two towers
        interleave, each in its order). "parallel": depth counted from the
        output along each stack, the i-th block from the top of each
        sharing a depth (two towers decay side by side).

    Returns:
      A `LayerwisePlan`: the `LayerwiseBlock`s, the output's first.

    Raises:
      ValueError: for a decay, `unfreeze_every` or `stacks` out of range, a model
        whose depth cannot be told (subclassed: pass its blocks), an
        unbuilt layer, a layer in two blocks, or a layer with an
        `OutputMask`.
      TypeError: for a model or block that is not a Keras model or layer.

    Example:

    >>> import keras, maskfit
    >>> model = keras.Sequential(
    ...     [keras.Input((4,)), keras.layers.Dense(8, name="body"),
    ...      keras.layers.Dropout(0.1), keras.layers.Dense(2, name="head")], name="net")
    >>> [(b.depth, b.multiplier, b.layers) for b in maskfit.layerwise_decay(model, 0.5)]
    [(0, 1.0, ('head',)), (1, 0.5, ('body',))]
    >>> maskfit.get_mask(model.get_layer("body"))
    ElementMask(shapes={'net/body/kernel': (), 'net/body/bias': ()})
    """
    plan, planned = _plan_blocks(model, decay, unfreeze_every, stacks)
    # Nothing is declared until every block is planned: a refusal changes nothing.
    for layer, spec, base in planned:
        set_mask(layer, spec)
        object.__setattr__(layer, _DECLARED_ATTR, (spec, base))
    return plan


def _plan_blocks(model, decay, unfreeze_every, stacks):
    """`(LayerwisePlan, [(layer, spec, base)])` for `model` or a list of blocks."""
    decay = _check_decay(decay)
    unfreeze_every = _check_unfreeze_every(unfreeze_every)
    _check_stacks(stacks, model)
    if isinstance(model, keras.Model):
        blocks, rules = _model_blocks(model, stacks)
    else:
        blocks = _blocks(model)
        rules = ["given"] * len(blocks)
    named = depth_lib.display_names(model, blocks)
    declared, planned = [], []
    for depth, (block, rule) in enumerate(zip(reversed(blocks), reversed(rules))):
        multiplier = decay**depth
        start = depth * unfreeze_every if unfreeze_every else 0
        for layer in block:
            planned += _plan(layer, multiplier, start)
        params = sum(int(np.prod(v.shape)) for x in block for v in x.trainable_weights)
        names = tuple(named[id(x)] for x in block)
        declared.append(LayerwiseBlock(depth, multiplier, start, names, params, rule))
    return LayerwisePlan(declared), planned


def _check_decay(decay):
    if (
        isinstance(decay, bool)
        or not isinstance(decay, numbers.Real)
        or not math.isfinite(decay)
        or not 0 < decay <= 1
    ):
        raise ValueError(
            "Received an invalid value for `decay`, expected a number in (0, 1]"
            f" (e.g. 0.8: each block learns at 0.8 times the rate of the one"
            f" above it). Received: decay={decay!r}"
        )
    return float(decay)


def _check_unfreeze_every(steps):
    if steps is not None and (
        isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps <= 0
    ):
        raise ValueError(
            "Received an invalid value for `unfreeze_every`, expected None or a"
            f" positive integer (optimizer steps). Received: unfreeze_every={steps!r}"
        )
    return None if steps is None else int(steps)


def _blocks(blocks):
    """Checks a list of blocks; returns it as a list of lists of layers."""
    if isinstance(blocks, keras.layers.Layer) or not isinstance(blocks, (list, tuple)):
        raise TypeError(
            "layerwise_decay expects a keras.Sequential or functional model, or a"
            " list of blocks (each a layer or a list of layers), input side first."
            f" Received: {blocks!r}"
        )
    if not blocks:
        raise ValueError("layerwise_decay received an empty list of blocks.")
    found, seen = [], {}
    for index, block in enumerate(blocks):
        layers = list(block) if isinstance(block, (list, tuple)) else [block]
        for layer in layers:
            if not isinstance(layer, keras.layers.Layer):
                raise TypeError(
                    f"Block {index} of layerwise_decay holds {layer!r}, which is not"
                    " a Keras layer. Pass layers, or lists of layers."
                )
            for inner in [layer] + internals.sublayers(layer):
                if id(inner) in seen:
                    raise ValueError(
                        f"Layer '{inner.name}' is in block {seen[id(inner)]} and in"
                        f" block {index} (itself or inside '{layer.name}'). Put each"
                        " layer in one block."
                    )
                seen[id(inner)] = index
            if not layer.built:
                raise ValueError(
                    f"Layer '{layer.name}' is not built yet, so its variables are"
                    " unknown. Build the model first (call it on a batch, or start"
                    " it with keras.Input), then call layerwise_decay."
                )
        found.append(layers)
    return found


def _check_stacks(stacks, model):
    if stacks not in stacks_lib.STACKS:
        raise ValueError(
            "Received an invalid value for `stacks`, expected one of"
            f" {', '.join(repr(x) for x in stacks_lib.STACKS)} ('sequential':"
            " one depth per block, an encoder's layers below the decoder's;"
            " 'parallel': each stack counted from the outputs, its i-th layer"
            f" from the top sharing a depth with the others'). Received: stacks={stacks!r}"
        )
    if stacks != "sequential" and not isinstance(model, keras.Model):
        raise ValueError(
            f"`stacks={stacks!r}` orders the stacks found in a model's graph; a"
            " list of blocks is already in the order given. Leave `stacks` out, or"
            " pass the model."
        )


def _model_blocks(model, stacks):
    """The blocks of a built model, input side first (see `maskfit.spec.depth`)."""
    if not model.built:
        raise ValueError(
            f"Model '{model.name}' is not built yet, so its variables are"
            " unknown. Build the model first (call it on a batch, or start"
            " it with keras.Input), then call layerwise_decay."
        )
    found = depth_lib.model_blocks(model, stacks)
    blocks = [block.layers for block in found]
    _blocks(blocks)  # each built, each once
    return blocks, [block.described() for block in found]


def _plan(layer, multiplier, start):
    """`[(layer, spec, base)]`: `multiplier` (from step `start`, 0 before) on `layer`.

    Nested layers with their own mask get it multiplied; the rest of the
    layer's trainable variables get a scalar mask on `layer` itself. `base`
    is the mask the new spec multiplies.
    """
    nested = [x for x in internals.sublayers(layer) if get_mask(x) is not None]
    taken = {id(v) for x in nested for v in x.trainable_weights}
    planned = [_multiply(x, x.trainable_weights, multiplier, start) for x in nested]
    own = [v for v in layer.trainable_weights if id(v) not in taken]
    if own or get_mask(layer) is not None:
        planned.append(_multiply(layer, own, multiplier, start))
    return planned


def _multiply(layer, variables, multiplier, start):
    """`(layer, spec, base)`: its mask `base` (if any) times the factor, over `variables`."""
    current = get_mask(layer)
    mine, base = getattr(layer, _DECLARED_ATTR, (None, None))
    if current is not None and current is mine:
        current = base  # declared by us: replace our factor, keep the rest
    if isinstance(current, OutputMask) or (
        isinstance(current, PiecewiseMask) and isinstance(current.specs[0], OutputMask)
    ):
        raise ValueError(
            f"Layer '{layer.name}' carries {current!r}; layerwise_decay multiplies"
            " masks per variable, which an OutputMask cannot hold (its shared"
            " entries stay at 1). Declare that mask as an ElementMask, or leave"
            " the layer out of the blocks."
        )
    boundaries, specs = ((), (None,)) if current is None else current.schedule()
    factors = ((), (multiplier,)) if start == 0 else ((start,), (0.0, multiplier))
    steps = sorted(set(boundaries) | set(factors[0]))
    intervals = [
        ElementMask(
            _scaled(layer, variables, _at(boundaries, specs, step), _at(*factors, step))
        )
        for step in [0] + steps
    ]
    spec = intervals[0] if not steps else PiecewiseMask(steps, intervals)
    return layer, spec, current


def _at(boundaries, values, step):
    """The value in force at `step` of a piecewise schedule."""
    return values[int(np.searchsorted(boundaries, step, side="right"))]


def _scaled(layer, variables, spec, factor):
    """`{path: mask * factor}` for `variables` and those `spec` names on `layer`."""
    masks = {} if spec is None else {v.path: m for v, m, _ in spec.resolve(layer)}
    paths = list(dict.fromkeys([v.path for v in variables] + list(masks)))
    return {
        path: (np.asarray(masks[path], np.float32) * np.float32(factor))
        if path in masks
        else np.float32(factor)
        for path in paths
    }
