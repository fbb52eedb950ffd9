"""MultiHeadAttention, GroupQueryAttention, Attention and AdditiveAttention.

The units of MultiHeadAttention and GroupQueryAttention are their output
projection's; every other weight mixes them. Magnitude pruning prunes
their EinsumDense projections' kernels (TF-MOT: the four attention
kernels). Structured pruning removes whole heads of MultiHeadAttention and
its output units; Attention and AdditiveAttention pass the values through
when a separate key is given.
"""

from maskfit import internals
from maskfit.kinds.record import CONTAINER, NO_WEIGHTS, LayerKind
from maskfit.structured import couplings_sequence as couplings
from maskfit.structured import sizes
from maskfit.structured.couplings import Refused
from maskfit.units import lookup
from maskfit.units.declaration import SHARED, OutputUnits
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["KINDS"]


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
    queries = sizes.count(shapes[0][:-1] + (1,))
    keys = sizes.count(shapes[-1][:-1] + (1,)) if len(shapes) > 1 else queries
    for sub in internals.sublayers(layer, recursive=False):
        kernel = sizes.weight(sub, "kernel")
        if kernel is None:
            continue
        rows = queries if sub.name in ("query", "gate", "attention_output") else keys
        total += rows * sizes.size(kernel)
    heads = layer.num_heads
    total += (
        heads * queries * keys * (layer.key_dim + (layer.value_dim or layer.key_dim))
    )
    return total


_SCORES = LayerKind(
    units=_scores_only, prunable=NO_WEIGHTS, coupling=couplings.KerasAttention()
)

KINDS = {
    L.MultiHeadAttention: LayerKind(
        units=_multi_head_attention,
        prunable=CONTAINER,
        coupling=couplings.MultiHeadAttention(),
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
