"""Derived couplings of blocks that must be rebuilt or called as the model does.

Blocks from `tests/helpers/derived_calls.py`: a config with a key its
`__init__` refuses, weights made in `call`, a weight sized by the sequence
at build, a call with a mask and a bias besides its input, and one called
by keyword only. Each gets exactly the units its computation says (ids per
weight axis), under JAX in-process and under TensorFlow in the JAX worker;
the block called with extra tensors prunes and shrinks to outputs equal to
the masked model's.
"""

import keras
import numpy as np
import pytest

import maskfit.pruning as pruning
from maskfit.kinds.couplings import arguments
from maskfit.structured.derive import coupling as derive_coupling
from tests.helpers import derived_calls as calls
from tests.structured import test_derive

SHAPE = (None, calls.SEQUENCE, calls.HIDDEN)
_UNITS = list(range(6))
_FFN = {
    "up/kernel": (1, _UNITS, False),
    "up/bias": (0, _UNITS, False),
    "gate/kernel": (1, _UNITS, False),
    "down/kernel": (0, _UNITS, True),
}
# 4 query heads in 2 key/value groups: a unit is a key/value head and its group.
_HEADS = {
    "query/kernel": (1, [0, 0, 1, 1], False),
    "key/kernel": (1, [0, 1], False),
    "value/kernel": (1, [0, 1], False),
    "attention_output/kernel": (0, [0, 0, 1, 1], True),
}


def _spaces(block, described=None):
    """`{space name: {weight path after the block: (axis, ids, closes)}}`."""
    return test_derive._spaces(block, described, SHAPE)


def _call_of(model, block):
    """`(args, kwargs)` of `block`'s call in `model`'s graph, described."""
    from maskfit.structured.graph import keras_graph

    _, found, _ = keras_graph.graph_of(model)
    call = next(c for c in found if c.layer is block)
    first = call.inputs[arguments.first_input(call)]
    return arguments.describe(call.args, call.kwargs, first)


# Under JAX the layer itself is traced: no config round trip, no rebuild.
@pytest.mark.backends("tensorflow")
def test_a_config_key_init_refuses_is_dropped_in_the_worker():
    _, block = calls.build(calls.ExtraKeyFFN)
    with pytest.raises(TypeError, match="Unrecognized keyword arguments"):
        type(block).from_config(block.get_config())
    assert _spaces(block) == {"units": _FFN}


@pytest.mark.backends("tensorflow")
def test_sublayers_keras_named_match_in_the_worker_whatever_their_number():
    for _ in range(3):
        keras.layers.Dense(1)  # the next made-up Dense names: dense_3 on
    _, block = calls.build(calls.AutoNamedFFN)
    spaces, _, _ = derive_coupling.derive(block, SHAPE)
    assert [(s.name, s.size) for s in spaces] == [("units", 6)]


@pytest.mark.backends("tensorflow")
def test_weights_made_in_call_are_made_in_the_worker():
    _, block = calls.build(calls.LazyFFN)
    assert _spaces(block) == {"units": _FFN}


@pytest.mark.backends("tensorflow")
def test_a_weight_sized_by_the_sequence_is_built_at_a_concrete_shape():
    # Built at 5 positions, called at an unknown number: the worker cannot
    # build it at the call's shape, (None, None, 8).
    block = calls.SequenceNormFFN(name="block")
    block.build(SHAPE)
    inputs = keras.Input((None, calls.HIDDEN))
    block(inputs)
    spaces, _, _ = derive_coupling.derive(block, (None, None, calls.HIDDEN))
    assert {
        block.weights[e.weight].path.split("/", 1)[1]: (
            e.axis,
            e.ids.tolist(),
            e.closes,
        )
        for e in spaces[0].entries
    } == _FFN


@pytest.mark.backends("tensorflow", "jax")
def test_a_block_called_with_a_mask_and_a_bias_is_derived_with_them():
    model, block = calls.build(calls.BiasedAttention)
    described = _call_of(model, block)
    assert described["args"][0] == {"__maskfit_input__": True}
    assert described["kwargs"]["bias"] == {
        "__maskfit_tensor__": [[None, calls.SEQUENCE, calls.SEQUENCE], "float32"]
    }
    assert _spaces(block, described) == {"heads": _HEADS}


# Under TensorFlow only: under JAX the config search compiles each
# candidate (about 14 s here); the derivation is the same (above).
@pytest.mark.backends("tensorflow")
def test_a_block_called_with_a_mask_and_a_bias_prunes_and_shrinks():
    from tests.helpers import hub_cases

    model, block = calls.build(calls.BiasedAttention)
    selection = pruning.select_units(model, 0.5)
    assert len(selection.removed()["block"]["heads"]) == 1
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, calls.SEQUENCE, calls.HIDDEN)).astype("float32")
    keep = rng.random((2, calls.SEQUENCE, calls.SEQUENCE)) > 0.3
    bias = rng.normal(size=(2, calls.SEQUENCE, calls.SEQUENCE)).astype("float32")
    inputs = [x, keep, bias]
    expected = hub_cases.masked_outputs(selection, inputs)
    small = pruning.shrink(model, selection)
    hub_cases.assert_close(hub_cases.outputs(small, inputs), expected)
    shrunk = small.get_layer("block")
    assert (shrunk.heads, shrunk.kv_heads) == (2, 1)


@pytest.mark.backends("tensorflow", "jax")
def test_a_block_called_by_keyword_carries_units_on_its_first_parameter():
    # Keras lists a call's tensors with keywords sorted: `block(x=..., bias=...)`
    # lists the bias first; the units cross `x`, the signature's first.
    x = keras.Input((calls.SEQUENCE, calls.HIDDEN))
    keep = keras.Input((calls.SEQUENCE, calls.SEQUENCE), dtype="bool")
    bias = keras.Input((calls.SEQUENCE, calls.SEQUENCE))
    block = calls.BiasedAttention(name="block")
    model = keras.Model([x, keep, bias], block(x=x, keep=keep, bias=bias))
    assert _spaces(block, _call_of(model, block)) == {"heads": _HEADS}
    assert len(pruning.select_units(model, 0.5).removed()["block"]["heads"]) == 1


# Under TensorFlow only: JAX's symbolic shapes refuse the reshape of a table
# whose first axis is unknown, so such a model cannot be built there.
@pytest.mark.backends("tensorflow")
def test_a_call_its_zeros_cannot_size_is_derived_from_its_input_alone():
    x = keras.Input((calls.SEQUENCE, calls.HIDDEN))
    table = keras.Input(batch_shape=(None, calls.HIDDEN))  # a row per position
    block = calls.TableFFN(name="block")
    model = keras.Model([x, table], block(x, table=table))
    graph = pruning.DependencyGraph(model)
    assert [(s.name, s.size) for s in graph.spaces if s.layer is block] == [
        ("units", 6)
    ]


def test_a_call_no_zeros_can_stand_for_is_refused_naming_its_tensors():
    x = keras.Input((calls.SEQUENCE, calls.HIDDEN))
    table = keras.Input(batch_shape=(None,))  # the model says 1-D; the block reads 2-D
    block = calls.RotaryFFN(name="block")
    model = keras.Model([x, table], block(x, table))
    text = pruning.DependencyGraph(model).explain("block")
    assert "deriving one from its computation failed" in text, text
    assert (
        "(it was run with its other tensors as zeros, at the shapes the model's"
        " symbolic graph gives them: table (None,), each unknown dimension 5"
    ) in text, text
