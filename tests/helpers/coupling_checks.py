"""The coupling table against real gradients, for structured pruning's tests.

For a layer call and a unit its inputs carry: once the layer's entries
recorded for that unit are set to 0, no output position that does not carry
the unit may depend on the input channel that does; and a unit the layer
passes on reaches no other position even before. A wrong table (a kernel
axis off by one, a channel map that mixes) fails here, whatever outputs a
shrink test happens to compare. Layers that this CPU's TensorFlow runs only
under XLA (channels_first convolutions) are checked compiled.
"""

import inspect

import keras
import numpy as np
import tensorflow as tf

import maskfit
from maskfit.structured.graph import keras_graph
from tests.helpers.keras_versions import call_or_xla


def _random_arguments(call, rng):
    """The call's arguments with each KerasTensor replaced by a random tensor."""
    values = {}
    for tensor in call.inputs:
        if id(tensor) not in values:
            shape = [2 if d is None else d for d in tensor.shape]
            if "int" in str(tensor.dtype):
                values[id(tensor)] = tf.constant(
                    rng.integers(0, 3, size=shape), tensor.dtype
                )
            else:
                values[id(tensor)] = tf.constant(rng.normal(size=shape), tf.float32)
    args, kwargs = keras.tree.map_structure(
        lambda x: values[id(x)] if isinstance(x, keras.KerasTensor) else x,
        (call.args, call.kwargs),
    )
    return values, args, kwargs


def _roots(graph, ids):
    return np.array([graph._find(int(i)) if i >= 0 else -1 for i in ids])


def _zeroed_weights(graph, layer, node):
    """The layer's weights with every entry recorded for unit `node` (or a
    node joined to it) at 0; as they are for `node` None."""
    mapping = []
    for variable in getattr(layer, "weights", ()):  # keras.ops calls: none
        value = np.asarray(variable.numpy())
        entry = graph.slices_of(variable)
        if entry is not None and node is not None:
            for axis, ids in entry.axes.items():
                index = [slice(None)] * value.ndim
                index[axis] = np.flatnonzero(
                    _roots(graph, ids) == graph._find(int(node))
                )
                value = value.copy()
                value[tuple(index)] = 0
        mapping.append((variable, tf.constant(value, variable.dtype)))
    return mapping


def _elsewhere(graph, units, node, rank):
    """1 at the output positions (along the units' axis) that do not carry `node`."""
    if units is None or units.ids is None:
        return None
    shape = [1] * rank
    shape[units.axis] = -1
    return (_roots(graph, units.ids) != graph._find(int(node))).reshape(shape)


def _gradient(layer, args, kwargs, x, mapping, masks, seed):
    """d(random positive sum of the outputs, times `masks`)/dx."""

    def run():
        with tf.GradientTape() as tape:
            tape.watch(x)
            with keras.StatelessScope(state_mapping=mapping):
                outputs = keras.tree.flatten(layer(*args, **kwargs))
            total = tf.constant(0.0)
            for number, (out, mask) in enumerate(zip(outputs, masks)):
                if "float" not in str(out.dtype):
                    continue
                out = tf.cast(out, tf.float32)
                weights = tf.random.stateless_uniform(
                    tf.shape(out), (seed, number), minval=0.5, maxval=1.5
                )
                if mask is not None:
                    weights *= tf.constant(mask, tf.float32)
                total += tf.reduce_sum(out * weights)
        return tape.gradient(total, x)

    return np.asarray(call_or_xla(run))


def check_call(graph, call, units_in, units_out, rng, per_input=2):
    layer = call.layer
    training = {}
    if (
        "training" in inspect.signature(layer.call).parameters
        and "training" not in call.kwargs
    ):
        training["training"] = False
    for tensor in {id(t): t for t in call.inputs}.values():
        source = units_in[id(tensor)]
        if source.ids is None:
            continue
        # Removable units only: what stays need not be separable.
        positions = np.flatnonzero(graph.atoms_of(source.ids) >= 0)
        for position in rng.choice(
            positions, min(per_input, len(positions)), replace=False
        ):
            node = source.ids[position]
            # The very node in an output: the layer passes it on (a producer's
            # output is its own nodes, joined to the input's or not).
            own = any(
                s.first <= node < s.first + s.size
                for s in graph.spaces
                if s.layer is layer
            )
            passes = not own and any(
                units.ids is not None and np.any(units.ids == node)
                for units in units_out
            )
            masks = [
                _elsewhere(graph, units, node, len(out.shape))
                for out, units in zip(call.outputs, units_out)
            ]
            # A unit that passes through must reach no other position, even
            # before its entries are zeroed; zeroed, no unit may leak anywhere.
            for zeroed in (False, True) if passes else (True,):
                mapping = _zeroed_weights(graph, layer, node if zeroed else None)
                values, args, kwargs = _random_arguments(call, rng)
                gradient = _gradient(
                    layer,
                    args,
                    {**kwargs, **training},
                    values[id(tensor)],
                    mapping,
                    masks,
                    int(rng.integers(1 << 30)),
                )
                if gradient.ndim == 0:
                    continue  # no float output (a comparison): nothing to check
                gradient = np.moveaxis(gradient, source.axis, -1)
                assert not np.any(gradient[..., position]), (
                    f"'{layer.name}' ({type(layer).__name__}): outputs without unit {node}"
                    f" depend on input channel {position} ({'zeroed' if zeroed else 'as is'})"
                )


def check_graph(graph, seed=0):
    """Checks every layer call of `graph` (nested models' layers too)."""
    rng = np.random.default_rng(seed)
    checked = 0
    for call, units_in, units_out in graph.calls:
        if keras_graph.is_graph_model(call.layer):
            continue
        check_call(graph, call, units_in, units_out, rng)
        checked += 1
    return checked


def checked_half_shrink(model):
    """Checks `model`'s coupling table against gradients (`check_graph`: some
    calls checked), selects half its units (some removed) and shrinks it to
    them: returns `(selection, small)`."""
    graph = maskfit.pruning.DependencyGraph(model)
    assert check_graph(graph) > 0
    selection = maskfit.pruning.select_units(model, 0.5)
    assert selection.removed()
    return selection, maskfit.pruning.shrink(model, selection)
