"""Checks of a layer-wise plan that run on every backend.

`scalar_model(backbone)` puts a backbone in a `MaskedModel` whose output is
one number per example (a fixed random projection of each float output,
averaged and summed), so any backbone trains with a mean-squared loss. `check_sgd_step` runs one `fit` step
and compares every variable's step with a stock Keras model's SGD step on the
same graph, same weights and same batch, times the multiplier of the
variable's block: Keras computes both gradients, so the check holds on every
backend. `repeated_blocks(model)` lists the layers that make a model's stacks
(instances of a composite class made more than once, outermost first), the
layers no two of which may share a depth.
"""

import re

import keras
import numpy as np

import maskfit
from maskfit import internals

LR = 0.1


def scalar_model(backbone):
    """A `MaskedModel`: the backbone, then a fixed random projection of its float outputs.

    Each float output is multiplied by a fixed random vector along its last
    axis and averaged, the results summed: one number per example, whose
    gradient reaches every layer at a comparable scale (a mean square after a
    final norm would give the norm's scale most of it).
    """
    inputs = backbone.input
    rng = np.random.default_rng(2)
    found = []
    for output in keras.tree.flatten(backbone(inputs)):
        if "float" not in str(output.dtype) or len(output.shape) < 2:
            continue
        axes = tuple(range(1, len(output.shape)))
        if output.shape[-1] is not None:
            output = output * rng.normal(size=(output.shape[-1],)).astype("float32")
        found.append(keras.ops.mean(output, axis=axes))
    total = found[0]
    for more in found[1:]:
        total = total + more
    return maskfit.MaskedModel(inputs, total)


def _layer(model, name):
    """The layer a plan names: `name`, or `outer/inner` when two layers share it."""
    found = model
    for part in name.split("/"):
        found = next(x for x in internals.sublayers(found) if x.name == part)
    return found


def _batch_size(x):
    return int(keras.tree.flatten(x)[0].shape[0])


def multipliers(model, plan):
    """`{id(variable): multiplier}` from the plan's blocks (first block wins).

    By identity: two towers' variables may share a path (`embedding/...`).
    """
    found = {}
    for block in plan:
        for name in block.layers:
            for v in _layer(model, name).trainable_weights:
                found.setdefault(id(v), block.multiplier)
    return found


def check_sgd_step(model, x, plan, rtol=1e-3):
    """One SGD `fit` step of `model` equals a stock step at lr x multiplier, per variable."""
    y = np.random.default_rng(1).normal(size=(_batch_size(x),)).astype("float32")
    variables = model.trainable_weights
    start = [keras.ops.convert_to_numpy(v) for v in variables]

    stock = keras.Model(model.inputs, model.outputs)
    stock.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    stock.fit(x, y, batch_size=len(y), epochs=1, shuffle=False, verbose=0)
    reference = [keras.ops.convert_to_numpy(v) - w for v, w in zip(variables, start)]
    for v, w in zip(variables, start):
        v.assign(w)

    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x, y, batch_size=len(y), epochs=1, shuffle=False, verbose=0)
    factor = multipliers(model, plan)
    assert set(factor) == {id(v) for v in variables}, "a variable is in no block"
    seen, moving = set(), set()
    # A gradient that is 0 but for rounding (an attention's key bias: softmax
    # ignores it) is held to the model's scale, not its own.
    scale = max(float(np.linalg.norm(r)) for r in reference)
    for v, w, expected in zip(variables, start, reference):
        step = keras.ops.convert_to_numpy(v) - w
        expected = expected * np.float32(factor[id(v)])
        error = np.linalg.norm(step - expected)
        bound = rtol * np.linalg.norm(expected) + 1e-4 * scale
        assert error <= bound, (
            f"{v.path} at multiplier {factor[id(v)]}: its step is"
            f" {np.linalg.norm(step):.4g}, the reference's"
            f" {np.linalg.norm(expected):.4g}, apart by {error:.3g}"
        )
        if np.linalg.norm(expected) > 1e-3 * scale:
            seen.add(factor[id(v)])
        if np.any(expected):
            moving.add(factor[id(v)])
    # Each multiplier is checked on a step well above the tolerance: one off
    # by one block (a factor of decay <= 0.8: an error of 20% of the step,
    # over 2e-4 of the scale) would fail.
    # (Blocks whose variables get no gradient at all, such as XLNet's mask
    # embedding without a permutation mask, have nothing to check.)
    assert seen == moving, (
        f"multipliers {sorted(moving - seen)} move no variable"
        " visibly: the check would pass whatever the plan says there"
    )


def repeated_blocks(model):
    """The layers of the model's stacks, in the order their names number them.

    A stack: two or more layers of one class, holding layers, side by side in
    one layer or model (a backbone's transformer layers, an encoder's
    blocks), nested models left out (their own layers count).
    """
    found, stack = [], [model]
    while stack:
        outer = stack.pop()
        inner = _stacked(outer, _composite)
        for layer in internals.sublayers(outer, False):
            # A stack of stacks (VideoPrism's spatial and temporal encoders,
            # each holding its blocks): the blocks inside count.
            if any(x is layer for x in inner) and not _stacked(layer, _nested):
                found.append(layer)
            else:
                stack.append(layer)
    return sorted(found, key=lambda x: _number(x.name))


def _composite(layer):
    return bool(internals.sublayers(layer, False))


def _nested(layer):
    """Holds layers that hold layers (a block; not an attention of projections)."""
    return any(_composite(x) for x in internals.sublayers(layer, False))


def _stacked(outer, kind):
    """The direct sublayers of `outer` of a class it holds twice or more, each `kind`."""
    inner = internals.sublayers(outer, False)
    counts = {}
    for layer in inner:
        if not isinstance(layer, keras.Model) and kind(layer):
            counts[type(layer)] = counts.get(type(layer), 0) + 1
    return [x for x in inner if counts.get(type(x), 0) >= 2 and x.trainable_weights]


def stack_of(model, layer):
    """What groups `layer` with the others of its stack: its class, where it is,
    and its name without the number (T5's encoder and decoder layers share a
    class)."""
    stem = re.sub(r"_?\d+$", "", layer.name)
    return type(layer), id(parent_of(model, layer)), stem


def parent_of(model, layer):
    """The layer or model that holds `layer` directly."""
    stack = [model]
    while stack:
        outer = stack.pop()
        inner = internals.sublayers(outer, False)
        if any(x is layer for x in inner):
            return outer
        stack += inner
    return None


def _number(name):
    digits = re.search(r"(\d+)$", name)
    return int(digits.group(1)) if digits else -1


def depth_of_layers(model, plan):
    """`{id(layer): depth}` for every layer, a sublayer at its parent's depth."""
    found = {}
    for block in plan:
        for name in block.layers:
            outer = _layer(model, name)
            for layer in [outer, *internals.sublayers(outer)]:
                found.setdefault(id(layer), block.depth)
    return found


__all__ = [
    "LR",
    "check_sgd_step",
    "depth_of_layers",
    "multipliers",
    "parent_of",
    "repeated_blocks",
    "stack_of",
    "scalar_model",
]
