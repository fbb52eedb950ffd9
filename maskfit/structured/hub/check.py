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
"""

import inspect

import keras
import numpy as np

from maskfit.units import backprop

__all__ = ["check"]

_BATCH = 2
_FILL = 5


def _inputs(call, rng):
    shape = [
        _BATCH if i == 0 else (_FILL if d is None else d)
        for i, d in enumerate(call.input_shape(0))
    ]
    return rng.normal(size=shape).astype("float32")


def _gradients(layer, x, values, zeroed, seed):
    """Gradients of a random projection of `layer(x)` with respect to its weights.

    Taken by the backend that runs the layer (`maskfit.units.backprop`): a
    TensorFlow tape sees nothing of a JAX computation.
    """
    arrays = []
    for variable, value in zip(layer.weights, values):
        value = value.copy()
        for target, axis, positions in zeroed:
            if target is variable:
                index = [slice(None)] * value.ndim
                index[axis] = positions
                value[tuple(index)] = 0.0
        arrays.append(
            keras.ops.convert_to_numpy(
                keras.ops.convert_to_tensor(value, variable.dtype)
            )
        )
    kwargs = {}
    if "training" in inspect.signature(layer.call).parameters:
        kwargs["training"] = False

    def run(*mapped):
        with keras.StatelessScope(state_mapping=list(zip(layer.weights, mapped))):
            return keras.tree.flatten(layer(x, **kwargs))[0]

    gradients = backprop.projected_gradients(run, arrays, np.random.default_rng(seed))
    return {id(v): g for v, g in zip(layer.weights, gradients)}


def _problem(layer, x, values, space, sliced, node, before, seed):
    zeroed = [(v, axis, np.flatnonzero(ids == node)) for v, axis, ids, _ in sliced]
    after = _gradients(layer, x, values, zeroed, seed)
    # Relative to the largest gradient: below 1e-6 is float rounding (a key
    # bias's, which softmax cancels); a path cut by a zero weight gives
    # exactly 0 (a live gradient may pass near 0 by chance, not hit it).
    scale = max(float(np.max(np.abs(g))) for g in before.values())
    declared = {}
    for (variable, axis, positions), (*_, closes) in zip(zeroed, sliced):
        taken = np.take(after[id(variable)], positions, axis=axis)
        if not closes and np.any(np.abs(taken) > 1e-6 * scale):
            return (
                f"with unit {node - space.first} of {space.name} set to 0, the output"
                f" still depends on its entries of '{variable.path}'"
            )
        mark = np.zeros(after[id(variable)].shape, bool)
        index = [slice(None)] * mark.ndim
        index[axis] = positions
        mark[tuple(index)] = True
        declared[id(variable)] = declared.get(id(variable), False) | mark
    for variable in layer.weights:
        cut = (np.abs(before[id(variable)]) > 1e-5 * scale) & (after[id(variable)] == 0)
        if np.any(cut & ~declared.get(id(variable), False)):
            return (
                f"setting unit {node - space.first} of {space.name} to 0 cuts off"
                f" entries of '{variable.path}' that its coupling does not give it"
            )
    return None


def check(graph, call, spaces, seed=0):
    """Fixes the units of each space in `spaces` whose entries fail the check.

    Args:
      graph: the `DependencyGraph` being built.
      call: the block's `CallUnits` (its first input's shape is used).
      spaces: `[(space, [(variable, axis, ids, closes)])]`: each space and
        the entries its coupling gave its nodes; `closes` marks the output
        projection's, which cut the unit off (their own gradient is the
        unit's output: with one key/value head shared, a zeroed query head
        still attends, uniformly).
    """
    layer = call.layer
    rng = np.random.default_rng(seed)
    try:
        x = _inputs(call, rng)
        values = []
        for variable in layer.weights:
            fan_in = variable.shape[0] if len(variable.shape) else 1
            values.append(
                rng.normal(size=tuple(variable.shape)) / np.sqrt(max(fan_in, 1))
            )
    except Exception as error:  # noqa: BLE001 - whatever stops the check keeps the units
        for space, _ in spaces:
            graph.fix(space.ids, f"its units could not be checked: {error}")
        return
    try:
        before = _gradients(layer, x, values, [], seed)
    except Exception as error:  # noqa: BLE001
        for space, _ in spaces:
            graph.fix(space.ids, f"its units could not be checked: {error}")
        return
    for space, sliced in spaces:
        nodes = sorted({int(space.ids[0]), int(space.ids[-1])})
        for node in nodes:
            try:
                problem = _problem(layer, x, values, space, sliced, node, before, seed)
            except Exception as error:  # noqa: BLE001
                problem = f"the check could not run: {error}"
            if problem:
                graph.fix(
                    space.ids, f"its units fail maskfit's gradient check: {problem}"
                )
                break
