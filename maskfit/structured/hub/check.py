"""The gradient check of a keras_hub block's coupling: a removed unit is cut off.

A block's coupling says which entries of its sublayers' variables belong to
each head and FFN unit. `check` runs the block on random inputs with random
weights (the block's own are never touched: `keras.StatelessScope`), sets
one unit's entries to 0 and asks the gradients: the output must depend on
none of that unit's entries any more, but through its output projection's (its query weights reach no output once
its output rows are 0, its key and value weights reach no query head that
stays, its FFN column reaches nothing once its output row is 0); and every entry
that zeroing the unit cuts off from the output must be one the coupling gave
it (an FFN's up projection left out of the unit is found so). A unit whose
entries were wrongly placed (another head's slice, a query head given to the
wrong key/value group) leaves a live path or a stray cut, and fails. Two units of
each space are checked; a space that fails keeps its units, with the reason.

The verdict depends only on what the block computes and on the shapes it
is checked at (the random values come from a fixed seed), so blocks of one
signature (`maskfit.kinds.couplings.signature`: class, config, weight
shapes, input shape and the coupling's claims relative to the block) are
checked once per graph build and the others read the verdict back, told
with their own variables' paths.
"""

import keras
import numpy as np

from maskfit.kinds.couplings import arguments as call_arguments
from maskfit.kinds.couplings import signature as check_signature
from maskfit.units import backprop

__all__ = ["check"]


def _inputs(shape, rng):
    return rng.normal(size=call_arguments.concrete(shape)).astype("float32")


def _gradients(layer, x, arrays, zeroed, seed, described=None):
    """Gradients of a random projection of `layer(x)` with respect to its weights.

    `arrays` are the weights' values in their dtypes; `zeroed` lists
    `(variable, axis, positions)` set to 0 first (in copies). Taken by the
    backend that runs the layer (`maskfit.units.backprop`): a TensorFlow
    tape sees nothing of a JAX computation.
    """
    arrays = list(arrays)
    for i, variable in enumerate(layer.weights):
        for target, axis, positions in zeroed:
            if target is variable:
                value = arrays[i].copy()
                index = [slice(None)] * value.ndim
                index[axis] = positions
                value[tuple(index)] = 0
                arrays[i] = value

    def run(*mapped):
        with keras.StatelessScope(state_mapping=list(zip(layer.weights, mapped))):
            return keras.tree.flatten(call_arguments.call(layer, described, x))[0]

    gradients = backprop.projected_gradients(run, arrays, np.random.default_rng(seed))
    return {id(v): g for v, g in zip(layer.weights, gradients)}


def _reached(before):
    """`(scale, reached)` of the gradients with no unit zeroed.

    `scale` is the largest gradient's magnitude; `reached[id(variable)]`
    (bool, a quarter of the gradient's bytes, all `_problem` reads of it)
    marks the entries whose gradient is above 1e-5 of it.
    """
    scale = max(float(np.max(np.abs(g))) for g in before.values())
    return scale, {key: np.abs(g) > 1e-5 * scale for key, g in before.items()}


def _problem(layer, x, arrays, space, sliced, node, before, seed, described=None):
    """Why unit `node` fails, as `(kind, unit, weight index)`, or None.

    `before` is `_reached` of the gradients with no unit zeroed.
    """
    index_of = {id(v): i for i, v in enumerate(layer.weights)}
    zeroed = [(v, axis, np.flatnonzero(ids == node)) for v, axis, ids, _ in sliced]
    after = _gradients(layer, x, arrays, zeroed, seed, described)
    # Relative to the largest gradient: below 1e-6 is float rounding (a key
    # bias's, which softmax cancels); a path cut by a zero weight gives
    # exactly 0 (a live gradient may pass near 0 by chance, not hit it).
    scale, reached = before
    declared = {}
    unit = node - space.first
    for (variable, axis, positions), (*_, closes) in zip(zeroed, sliced):
        taken = np.take(after[id(variable)], positions, axis=axis)
        if not closes and np.any(np.abs(taken) > 1e-6 * scale):
            return ("live", unit, index_of[id(variable)])
        mark = np.zeros(after[id(variable)].shape, bool)
        index = [slice(None)] * mark.ndim
        index[axis] = positions
        mark[tuple(index)] = True
        declared[id(variable)] = declared.get(id(variable), False) | mark
    for variable in layer.weights:
        cut = reached[id(variable)] & (after[id(variable)] == 0)
        if np.any(cut & ~declared.get(id(variable), False)):
            return ("cut", unit, index_of[id(variable)])
    return None


def _verdicts(layer, shape, spaces, seed, described=None):
    """One verdict per space: None (it passes) or why it fails, as a tuple."""
    rng = np.random.default_rng(seed)
    try:
        x = _inputs(shape, rng)
        arrays = []
        for variable in layer.weights:
            fan_in = variable.shape[0] if len(variable.shape) else 1
            value = rng.normal(size=tuple(variable.shape)) / np.sqrt(max(fan_in, 1))
            # Once, in the variable's dtype (zeroing commutes with the cast).
            arrays.append(
                keras.ops.convert_to_numpy(
                    keras.ops.convert_to_tensor(value, variable.dtype)
                )
            )
            del value
    except Exception as error:  # noqa: BLE001 - whatever stops the check keeps the units
        return (("unchecked", str(error)),) * len(spaces)
    try:
        before = _reached(_gradients(layer, x, arrays, [], seed, described))
    except Exception as error:  # noqa: BLE001
        return (("unchecked", str(error)),) * len(spaces)
    verdicts = []
    for space, sliced in spaces:
        verdict = None
        for node in sorted({int(space.ids[0]), int(space.ids[-1])}):
            try:
                verdict = _problem(
                    layer, x, arrays, space, sliced, node, before, seed, described
                )
            except Exception as error:  # noqa: BLE001
                verdict = ("failed", str(error))
            if verdict:
                break
        verdicts.append(verdict)
    return tuple(verdicts)


def _reason(verdict, layer, space):
    kind, *rest = verdict
    if kind == "unchecked":
        return f"its units could not be checked: {rest[0]}"
    if kind == "failed":
        problem = f"the check could not run: {rest[0]}"
    else:
        unit, index = rest
        path = layer.weights[index].path
        problem = (
            f"with unit {unit} of {space.name} set to 0, the output still depends"
            f" on its entries of '{path}'"
            if kind == "live"
            else f"setting unit {unit} of {space.name} to 0 cuts off entries of"
            f" '{path}' that its coupling does not give it"
        )
    return f"its units fail maskfit's gradient check: {problem}"


def _claims(layer, spaces):
    """What the coupling says, relative to the block (its weights' order, each space's first node)."""
    index_of = {id(v): i for i, v in enumerate(layer.weights)}
    claims = []
    for space, sliced in spaces:
        entries = []
        for variable, axis, ids, closes in sliced:
            if id(variable) not in index_of:
                return None
            relative = np.asarray(ids, np.int64) - space.first
            entries.append((index_of[id(variable)], axis, relative.tobytes(), closes))
        claims.append((space.name, space.size, tuple(entries)))
    return tuple(claims)


def check(graph, call, spaces, seed=0, described=None, shape=None):
    """Fixes the units of each space in `spaces` whose entries fail the check.

    Blocks of one signature are checked once per graph build (`graph.memo`).

    Args:
      graph: the `DependencyGraph` being built.
      call: the block's `CallUnits` (its first input's shape is used).
      spaces: `[(space, [(variable, axis, ids, closes)])]`: each space and
        the entries its coupling gave its nodes; `closes` marks the output
        projection's, which cut the unit off (their own gradient is the
        unit's output: with one key/value head shared, a zeroed query head
        still attends, uniformly).
      described: the call's arguments (`arguments.describe`): the block is
        run with its other tensors as zeros; None: its first input alone.
      shape: the shape of the input the units cross (None: the first's).
    """
    layer = call.layer
    shape = call.input_shape(0) if shape is None else shape
    claims = _claims(layer, spaces)
    key = None
    if claims is not None:
        key = check_signature.signature(
            layer,
            shape,
            "keras_hub block",
            seed,
            claims,
            call_arguments.key(described),
        )
    memo = getattr(graph, "memo", None)
    memo = check_signature.Memo() if memo is None else memo
    verdicts = memo.outcome(
        key, lambda: _verdicts(layer, shape, spaces, seed, described)
    )
    for (space, _), verdict in zip(spaces, verdicts):
        if verdict:
            graph.fix(space.ids, _reason(verdict, layer, space))
