"""MultiHeadAttention, GroupQueryAttention, Attention and AdditiveAttention.

The units of MultiHeadAttention and GroupQueryAttention are their output
projection's; every other weight mixes them. Magnitude pruning prunes
their EinsumDense projections' kernels (TF-MOT: the four attention
kernels). Structured pruning removes whole heads of MultiHeadAttention and
its output units; Attention and AdditiveAttention pass the values through
when a separate key is given.
"""

from maskfit import internals
from maskfit.kinds import common
from maskfit.kinds.couplings.base import Coupling, Refused
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.kinds.couplings.parts import (
    check_own,
    no_units,
    read_units,
    sublayer,
    variable,
)
from maskfit.records import CONTAINER, NO_WEIGHTS, LayerKind
from maskfit.units import lookup
from maskfit.units.declaration import SHARED, OutputUnits
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["KerasAttention", "KINDS", "MultiHeadAttention"]


# The couplings of the attention layers.


class MultiHeadAttention(Coupling):
    """Whole heads, and the units of the output projection."""

    def couple(self, call, graph):
        layer = call.layer
        heads = graph.new_space(layer, "heads", layer.num_heads, kind="heads")
        query, value = call.tensor("query"), call.tensor("value")
        key = value if call.tensor("key") is None else call.tensor("key")
        reading = {"query": query, "key": key, "value": value, "gate": query}
        for name, tensor in reading.items():
            dense = sublayer(layer, (name,))
            if dense is None:
                continue
            ids = read_units(_Shape(call, tensor), graph, call.units[id(tensor)], -1)
            if ids is not None:
                graph.slice(layer, variable(dense, "kernel"), 0, ids)
            graph.slice(layer, variable(dense, "kernel"), 1, heads.ids)
            if variable(dense, "bias") is not None:
                graph.slice(layer, variable(dense, "bias"), 0, heads.ids, scored=False)
        output = sublayer(layer, ("attention_output",))
        graph.slice(layer, variable(output, "kernel"), 0, heads.ids)
        size = variable(output, "kernel").shape[-1]
        own = graph.new_space(layer, "units", size)
        kernel = variable(output, "kernel")
        graph.slice(layer, kernel, -1, own.ids)
        owned = {id(kernel): (len(kernel.shape) - 1, own.ids)}
        bias = variable(output, "bias")
        if bias is not None:
            graph.slice(layer, bias, -1, own.ids, scored=False)
            owned[id(bias)] = (len(bias.shape) - 1, own.ids)
        check_own(graph, layer, own, owned)
        made = [TensorUnits(-1, own.ids)]
        if call.num_outputs > 1:
            scores = call.output_shape(1)
            if scores[1] == layer.num_heads:
                made.append(TensorUnits(1 - len(scores), heads.ids))
            else:
                graph.fix(
                    heads.ids, f"'{layer.name}' returns scores without a head axis"
                )
                made.append(no_units(layer, "returns scores"))
        return made

    def shrink_config(self, layer, config, shrunk):
        config["num_heads"] = shrunk.count(layer, "heads")
        shape = config.get("output_shape")
        count = shrunk.count(layer, "units")
        single = shape is None or isinstance(shape, int)
        config["output_shape"] = count if single else [*shape[:-1], count]
        return config


class _Shape:
    """A `CallUnits` stand-in whose first input is `tensor` (for `read_units`)."""

    def __init__(self, call, tensor):
        self.layer = call.layer
        self._shape = tuple(tensor.shape)

    def input_shape(self, i=0):
        return self._shape


class KerasAttention(Coupling):
    """Attention, AdditiveAttention: values pass through when a key is given."""

    def couple(self, call, graph):
        layer = call.layer
        units = [call.units[id(t)] for t in call.call.arguments.get("inputs")]
        query, value = units[0], units[1]
        key = units[2] if len(units) == 3 else value  # the value is the key
        for part in (query, key):
            graph.fix(
                part.ids, f"met in dot products by '{layer.name}' (query and key)"
            )
        if value.ids is not None and value.axis != -1:
            graph.fix(value.ids, f"read by '{layer.name}' along the last axis")
            value = no_units(layer, "reads its values along the last axis")
        scores = [no_units(layer, "returns attention scores")] * (call.num_outputs - 1)
        return [value] + scores


def _attention_output(layer, output_dense):
    """Only the output projection's entries belong to units; the rest mix them."""
    inner = lookup.output_units_of(output_dense)
    pairs = inner.pairs(output_dense)
    ids = {id(v) for v, _ in pairs}
    pairs += [(v, SHARED) for v in layer.trainable_weights if id(v) not in ids]
    # The second output, when asked for, is the attention scores: no units.
    return OutputUnits(inner.units, pairs, output_axis=(-1, None))


def _multi_head_attention(layer):
    return _attention_output(layer, layer.output_dense)


def _group_query_attention(layer):
    return _attention_output(layer, internals.attention_output_dense(layer))


def _scores_only(layer):
    """Attention layers whose only weights scale the scores: all shared."""
    shapes = layer.get_build_config()["input_shape"]
    units = shapes[1][-1]
    pairs = [(v, SHARED) for v in layer.trainable_weights]
    return OutputUnits(units, pairs, output_axis=(-1, None))


def _attention_macs(layer, shapes, output_shapes):
    total = 0
    queries = common.count(shapes[0][:-1] + (1,))
    # The keys are as many as the values (the call's second input; a mask
    # may come after them).
    keys = common.count(shapes[1][:-1] + (1,)) if len(shapes) > 1 else queries
    for sub in internals.sublayers(layer, recursive=False):
        kernel = common.weight(sub, "kernel")
        if kernel is None:
            continue
        rows = queries if sub.name in ("query", "gate", "attention_output") else keys
        total += rows * common.size(kernel)
    heads = layer.num_heads
    total += (
        heads * queries * keys * (layer.key_dim + (layer.value_dim or layer.key_dim))
    )
    return total


_SCORES = LayerKind(units=_scores_only, prunable=NO_WEIGHTS, coupling=KerasAttention())

KINDS = {
    L.MultiHeadAttention: LayerKind(
        units=_multi_head_attention,
        prunable=CONTAINER,
        coupling=MultiHeadAttention(),
        macs=_attention_macs,
    ),
    L.GroupQueryAttention: LayerKind(
        units=_group_query_attention,
        prunable=CONTAINER,
        coupling=Refused(
            "shares each key/value head among several query heads (not coupled yet)"
        ),
    ),
    L.Attention: _SCORES,
    L.AdditiveAttention: _SCORES,
}
