"""Layer-wise learning-rate decay: each block learns at decay**depth from the output."""

import math
import numbers
import typing

import keras
import numpy as np

from maskfit import internals
from maskfit.spec.declare import get_mask, set_mask
from maskfit.spec.masks import ElementMask, OutputMask
from maskfit.spec.schedule import PiecewiseMask

__all__ = ["LayerwiseBlock", "layerwise_decay"]

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
    """

    depth: int
    multiplier: float
    start: int
    layers: tuple


def layerwise_decay(model, decay, unfreeze_every=None):
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

    Args:
      model: a built `keras.Sequential` or functional model whose layers
        form one chain (each feeds the next; the layers with trainable
        variables are the blocks), or a list of blocks, input side first,
        each a layer or a list of layers (the last block is at depth 0).
      decay: the factor per block, in (0, 1].
      unfreeze_every: optimizer steps between two blocks' unfreezing, a
        positive integer; None (the default) trains every block from step 0.

    Returns:
      The `LayerwiseBlock`s, the output's first.

    Raises:
      ValueError: for a decay or `unfreeze_every` out of range, a model
        whose depth cannot be told (not one chain: pass its blocks), an
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
    decay = _check_decay(decay)
    unfreeze_every = _check_unfreeze_every(unfreeze_every)
    blocks = _model_blocks(model) if isinstance(model, keras.Model) else _blocks(model)
    declared, planned = [], []
    for depth, block in enumerate(reversed(blocks)):
        multiplier = decay**depth
        start = depth * unfreeze_every if unfreeze_every else 0
        for layer in block:
            planned += _plan(layer, multiplier, start)
        declared.append(
            LayerwiseBlock(depth, multiplier, start, tuple(x.name for x in block))
        )
    # Nothing is declared until every block is planned: a refusal changes nothing.
    for layer, spec, base in planned:
        set_mask(layer, spec)
        object.__setattr__(layer, _DECLARED_ATTR, (spec, base))
    return tuple(declared)


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


def _model_blocks(model):
    """The layers with trainable variables of a model that is one chain, in order."""
    if isinstance(model, keras.Sequential):
        layers = list(model.layers)
    elif isinstance(model, internals.functional_class()):
        layers = _chain(model)
    else:
        raise ValueError(
            f"layerwise_decay cannot tell the depth of the layers of model"
            f" '{model.name}' ({type(model).__name__}): only a Sequential or"
            " functional model says how its layers follow each other. Pass its"
            " blocks instead: layerwise_decay([block_1, ..., head], decay)."
        )
    _blocks(layers)  # each built, each once
    blocks = [[layer] for layer in layers if layer.trainable_weights]
    if not blocks:
        raise ValueError(f"Model '{model.name}' has no trainable variables.")
    return blocks


def _chain(model):
    """The layers of a functional `model`, if each feeds the next; else raises."""
    layers = [x for x in model.layers if not isinstance(x, keras.layers.InputLayer)]
    inputs, outputs = list(model.inputs), list(model.outputs)
    current = inputs[0] if len(inputs) == 1 else None
    for layer in layers:
        # A layer's own first call (a nested model's `input` is its own Input).
        given = keras.Operation.input.fget(layer)
        if current is None or given is not current:
            raise ValueError(
                f"layerwise_decay cannot tell the depth of layer '{layer.name}' in"
                f" model '{model.name}': its layers are not one chain (a layer with"
                " several inputs, a branch, a skip connection or a shared layer)."
                " Pass the model's blocks instead, input side first:"
                " layerwise_decay([block_1, ..., head], decay), each block a layer"
                " or a list of layers."
            )
        current = keras.Operation.output.fget(layer)
        current = current if not isinstance(current, (list, tuple)) else None
    if len(outputs) != 1 or current is not outputs[0]:
        raise ValueError(
            f"layerwise_decay cannot tell the depth of the layers of model"
            f" '{model.name}': its output is not the end of one chain of layers."
            " Pass its blocks instead: layerwise_decay([block_1, ..., head], decay)."
        )
    return layers


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
