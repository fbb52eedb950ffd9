"""Couplings derived from a layer's computation (`maskfit.structured.derive`).

Small custom blocks (`tests/helpers/derived_blocks.py`) that no record or
spec names: their heads, key/value groups and FFN units are read from the
block's jaxpr under JAX, exactly (ids per weight axis); a reduction over the
units is refused naming the operation; a wrong derived coupling fails the
gradient check; under TensorFlow the refusal says derivation needs JAX.
The cross-check: on every keras_hub block class the hand specs cover, the
derived coupling equals the spec.
"""

import keras
import numpy as np
import pytest

import maskfit.pruning as pruning
from maskfit.kinds.couplings.base import Refused
from maskfit.structured.derive import coupling as derive_coupling
from tests.helpers import derived_blocks as blocks
from tests.helpers import hub_cases

SHAPE = (None, blocks.SEQUENCE, blocks.HIDDEN)


def _spaces(block, described=None, shape=SHAPE):
    """`{space name: {weight path after the block: (axis, ids, closes)}}`."""
    spaces, _, residual = derive_coupling.derive(block, shape, described)
    assert residual
    return {
        s.name: {
            block.weights[e.weight].path.split("/", 1)[1]: (
                e.axis,
                e.ids.tolist(),
                e.closes,
            )
            for e in s.entries
        }
        for s in spaces
    }


_UNITS = list(range(6))


@pytest.mark.backends("jax")
@pytest.mark.parametrize("gated", [True, False])
def test_ffn_units_are_derived(gated):
    _, block = blocks.build(blocks.GatedFFN, gated=gated)
    expected = {
        "up/kernel": (1, _UNITS, False),
        "up/bias": (0, _UNITS, False),
        "down/kernel": (0, _UNITS, True),
    }
    if gated:
        expected["gate/kernel"] = (1, _UNITS, False)
    assert _spaces(block) == {"units": expected}


def _heads(query, kv):
    found = {
        "query/kernel": (1, query, False),
        "attention_output/kernel": (0, query, True),
    }
    if kv is not None:
        found |= {"key/kernel": (1, kv, False), "value/kernel": (1, kv, False)}
    return found


@pytest.mark.backends("jax")
@pytest.mark.parametrize(
    "kv_heads, rotary, query, kv",
    [
        # 4 query heads in 2 groups: a unit is a key/value head and its group.
        (2, "stack", [0, 0, 1, 1], [0, 1]),
        (2, "halves", [0, 0, 1, 1], [0, 1]),
        (2, None, [0, 0, 1, 1], [0, 1]),
        (4, "stack", [0, 1, 2, 3], [0, 1, 2, 3]),
        # One key/value head shared by all: a unit is a query head, it stays.
        (1, "stack", [0, 1, 2, 3], None),
    ],
)
def test_grouped_heads_are_derived(kv_heads, rotary, query, kv):
    _, block = blocks.build(blocks.GroupedAttention, kv_heads=kv_heads, rotary=rotary)
    assert _spaces(block) == {"heads": _heads(query, kv)}


@pytest.mark.backends("jax")
def test_heads_reshaped_out_of_dense_columns_are_derived():
    # Each Dense column is one (head, head_dim) position: a head's 4 columns go together.
    _, block = blocks.build(blocks.GroupedAttention, fused=True)
    query, kv = np.repeat([0, 0, 1, 1], 4).tolist(), np.repeat([0, 1], 4).tolist()
    assert _spaces(block) == {
        "heads": {
            "query/kernel": (1, query, False),
            "query/bias": (0, query, False),
            "key/kernel": (1, kv, False),
            "key/bias": (0, kv, False),
            "value/kernel": (1, kv, False),
            "value/bias": (0, kv, False),
            "attention_output/kernel": (0, query, True),
        }
    }


def _parallel_block_spaces():
    """What `_spaces` reads on `blocks.ParallelBlock`: 2 heads, the FFN's units."""
    return {
        "heads": _heads([0, 0, 1, 1], [0, 1]),
        "units": {
            "ffn/up/kernel": (1, _UNITS, False),
            "ffn/up/bias": (0, _UNITS, False),
            "ffn/down/kernel": (0, _UNITS, True),
        },
    }


@pytest.mark.backends("jax")
def test_a_parallel_block_has_heads_and_ffn_units():
    model, block = blocks.build(blocks.ParallelBlock)
    assert _spaces(block) == _parallel_block_spaces()
    assert isinstance(pruning.coupling_of(block), derive_coupling.Derived)
    graph = pruning.DependencyGraph(model)
    assert [(s.name, s.size) for s in graph.spaces if s.layer is block] == [
        ("heads", 2),
        ("units", 6),
    ]
    selection = pruning.select_units(model, 0.5)
    removed = selection.removed()["block"]
    assert (len(removed["heads"]), len(removed["units"])) == (1, 3)
    # shrink finds the heads' counts in the config (`heads`, `kv_heads`);
    # its FFN's width is fixed in `build`, so those units stay, at 0, and it
    # warns. The outputs are the masked model's.
    x = np.random.default_rng(0).normal(size=(2, blocks.SEQUENCE, blocks.HIDDEN))
    x = x.astype("float32")
    expected = hub_cases.masked_outputs(selection, x)
    warned = "'block' \\(ParallelBlock\\) keeps part of its size"
    with pytest.warns(UserWarning, match=warned):
        small = pruning.shrink(model, selection)
    hub_cases.assert_close(hub_cases.outputs(small, x), expected)
    shrunk = small.get_layer("block")
    assert (shrunk.heads, shrunk.kv_heads) == (2, 1)
    assert tuple(shrunk.query.kernel.shape) == (blocks.HIDDEN, 2, 4)
    down = shrunk.ffn.down.kernel
    assert tuple(down.shape) == (6, blocks.HIDDEN)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(down)[removed["units"]], 0)


@pytest.mark.backends("jax")
def test_a_reduction_over_the_units_is_refused_naming_it():
    model, block = blocks.build(blocks.ReducedFFN)
    text = pruning.DependencyGraph(model).explain("block")
    assert "deriving one from its computation found no unit" in text
    assert "'block/down/kernel' axis 0: 'reduce_sum' reduces over it" in text


def _derive_without(monkeypatch, part):
    """Makes the derivation wrong: it leaves out the weights whose path has `part`."""
    right = derive_coupling.derive

    def wrong(layer, shape, described=None):
        spaces, reasons, residual = right(layer, shape, described)
        kept = [
            s._replace(
                entries=tuple(
                    e for e in s.entries if part not in layer.weights[e.weight].path
                )
            )
            for s in spaces
        ]
        return kept, reasons, residual

    monkeypatch.setattr(derive_coupling, "derive", wrong)


@pytest.mark.backends("jax")
def test_a_wrong_derived_coupling_fails_the_gradient_check(monkeypatch):
    model, block = blocks.build(blocks.GatedFFN)
    _derive_without(monkeypatch, "up/")
    text = pruning.DependencyGraph(model).explain("block")
    assert "6 stay" in text and "gradient check" in text
    assert "cuts off entries of 'block/up/kernel'" in text


@pytest.mark.backends("jax")
def test_one_signature_is_derived_once(monkeypatch):
    _, block = blocks.build(blocks.GatedFFN, units=5)
    calls = []
    trace = derive_coupling.derive_trace.trace
    monkeypatch.setattr(
        derive_coupling.derive_trace,
        "trace",
        lambda *args: calls.append(1) or trace(*args),
    )
    first = derive_coupling.derive(block, SHAPE)
    _, twin = blocks.build(blocks.GatedFFN, units=5)
    assert derive_coupling.derive(twin, SHAPE) is first and len(calls) == 1


@pytest.mark.backends("torch")
def test_torch_refuses_saying_derivation_needs_tensorflow_or_jax():
    model, block = blocks.build(blocks.GatedFFN)
    found = pruning.coupling_of(block)
    assert isinstance(found, Refused)
    assert "only under tensorflow or jax" in found.reason
    assert "register_coupling" in found.reason


# Under TensorFlow the block is rebuilt from its class and config in a JAX
# worker process (about 10 s to start one), derived there and checked here.
@pytest.mark.backends("tensorflow")
def test_tensorflow_derives_in_a_jax_worker_and_checks_here(monkeypatch):
    model, block = blocks.build(blocks.ParallelBlock)
    assert _spaces(block) == _parallel_block_spaces()
    removed = pruning.select_units(model, 0.5).removed()["block"]
    assert (len(removed["heads"]), len(removed["units"])) == (1, 3)
    # The same derivation, wrong (the FFN's up projection left out): the
    # check under TensorFlow refuses it.
    _derive_without(monkeypatch, "/up/")
    text = pruning.DependencyGraph(model).explain("block")
    assert "6 stay" in text and "cuts off entries of 'block/ffn/up/kernel'" in text


@pytest.mark.backends("tensorflow")
def test_a_layer_the_worker_cannot_rebuild_is_refused_naming_why():
    class Local(blocks.GatedFFN):
        pass

    inputs = keras.Input((blocks.SEQUENCE, blocks.HIDDEN))
    model = keras.Model(inputs, Local(name="local")(inputs))
    text = pruning.DependencyGraph(model).explain("local")
    assert "defined in a function, so a JAX worker process cannot import it" in text
    model, _ = blocks.build(blocks.ForgetfulFFN, units=5)
    text = pruning.DependencyGraph(model).explain("block")
    assert "the JAX worker that derives it failed: ValueError: its config" in text
    assert "rebuilds other weights" in text


# The cross-check with keras_hub's hand-written specs (keras-hub 0.32: its
# Llama 3 backbone builds `LlamaTransformerDecoder`s, so the spec of
# `Llama3TransformerDecoder`, a class of older releases, is not reached).
HUB = {
    "llama": "LlamaTransformerDecoder",
    "mistral": "MistralTransformerDecoder",
    "qwen": "QwenTransformerDecoder",
    "gemma": "GemmaDecoderBlock",
    "gemma-2kv": "GemmaDecoderBlock",
    "bert": "TransformerEncoder",
    "gpt2": "TransformerDecoder",
    "vit": "ViTEncoder",
}


@pytest.mark.backends("jax")
@pytest.mark.parametrize("name", sorted(HUB))
def test_derived_couplings_equal_the_keras_hub_specs(name):
    pytest.importorskip("keras_hub")
    from maskfit.structured.hub import couplings as couplings_hub

    if name == "gemma-2kv":
        model = hub_cases.backbone("gemma", num_key_value_heads=2)
    else:
        model, _ = hub_cases.build(name)
    found = [layer for layer in model.layers if type(layer).__name__ == HUB[name]][0]
    spec = couplings_hub.coupling_for(found)
    shape = (None,) + tuple(
        found.input[0].shape if isinstance(found.input, list) else found.input.shape
    )[1:]
    derived, recorded = blocks.derived(found, shape), blocks.recorded(spec, found)
    assert derived == recorded
    assert len(recorded) >= 2  # heads and FFN units, each compared


def test_the_cross_check_names_every_spec_class_but_one():
    from maskfit.structured.hub import couplings as couplings_hub

    assert set(couplings_hub.SPECS) - set(HUB.values()) == {"Llama3TransformerDecoder"}
