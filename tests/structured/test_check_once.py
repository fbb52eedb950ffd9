"""Each distinct block is gradient-checked once per graph build, with the same verdicts.

`DependencyGraph` checks a keras_hub block's coupling (`hub/check.py`) and a
declared `UnitCoupling` (`kinds/couplings/check.py`) against the layer's
gradients. Blocks of one signature (class, config, weight shapes, input
shape, the coupling's claims) get the verdict of the first, told with
their own variables; a block that computes differently is checked itself.
"""

import keras
import numpy as np
import pytest

import maskfit.pruning as pruning
from maskfit.kinds.couplings import check as declared_check
from maskfit.kinds.couplings import signature as check_signature
from maskfit.structured.hub import check as hub_check
from maskfit.structured.hub import couplings as couplings_hub
from tests.helpers import hub_cases

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")


def _counting(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args[0].name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _unshared(monkeypatch):
    """Every call checked on its own, as before the memo."""
    monkeypatch.setattr(check_signature, "signature", lambda *args, **kwargs: None)


@pytest.mark.backends("tensorflow", "jax")
def test_identical_llama_blocks_are_checked_once_with_the_same_units(monkeypatch):
    model = hub_cases.backbone("llama", num_layers=4)
    calls = _counting(monkeypatch, hub_check, "_verdicts")
    selection = pruning.select_units(model, 0.5)
    assert calls == ["transformer_layer_0"]
    assert selection.graph.memo.runs == 1

    _unshared(monkeypatch)
    calls.clear()
    alone = pruning.select_units(model, 0.5)
    assert len(calls) == 4
    np.testing.assert_array_equal(selection.kept, alone.kept)
    assert selection.removed() == alone.removed()
    assert selection.graph.explain() == alone.graph.explain()


def test_a_wrong_coupling_fails_in_every_block_naming_its_own_variable(monkeypatch):
    model = hub_cases.backbone("llama", num_layers=3)
    spec = couplings_hub.SPECS["LlamaTransformerDecoder"]
    wrong = spec._replace(ffn_in=(("feedforward_gate_dense",),))  # up left out
    monkeypatch.setitem(couplings_hub.SPECS, "LlamaTransformerDecoder", wrong)
    calls = _counting(monkeypatch, hub_check, "_verdicts")
    graph = pruning.DependencyGraph(model)
    assert len(calls) == 1
    for i in range(3):
        text = graph.explain(f"transformer_layer_{i}")
        assert "gradient check" in text
        assert f"transformer_layer_{i}/feedforward_intermediate_dense/kernel" in text
        for j in {0, 1, 2} - {i}:
            assert f"transformer_layer_{j}/" not in text


def _decoders(widths):
    inputs = keras.Input((hub_cases.SEQUENCE, 16))
    x = inputs
    for i, width in enumerate(widths):
        x = keras_hub.layers.TransformerDecoder(width, 4, name=f"block_{i}")(x)
        x = keras.layers.Dense(16, name=f"mix_{i}")(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(x))


def test_a_block_with_another_config_is_checked_on_its_own(monkeypatch):
    calls = _counting(monkeypatch, hub_check, "_verdicts")
    graph = pruning.DependencyGraph(_decoders([32, 32, 64, 32]))
    assert calls == ["block_0", "block_2"]
    assert graph.memo.runs == 2


class _Scaled(keras.layers.Layer):
    """Multiplies each channel by its own weight: channel c reads scale[c] only."""

    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), name="scale")

    def call(self, x):
        return x * self.scale

    def maskfit_unit_coupling(self):
        return pruning.UnitCoupling(passes=True, per_channel={"scale": 0})


def test_declared_couplings_are_checked_once_per_signature(monkeypatch):
    calls = _counting(monkeypatch, declared_check, "_problems")
    inputs = keras.Input((8,))
    x = keras.layers.Dense(8, name="a")(inputs)
    x = _Scaled(name="s0")(x)
    x = _Scaled(name="s1")(keras.layers.Dense(8, name="b")(x))
    x = _Scaled(name="s2")(keras.layers.Dense(6, name="c")(x))
    pruning.DependencyGraph(keras.Model(inputs, keras.layers.Dense(2)(x)))
    assert calls == ["s0", "s2"]  # s2 reads 6 channels: another signature


@pytest.mark.filterwarnings("ignore:The object being serialized includes a `lambda`")
def test_a_config_that_cannot_be_written_has_no_signature():
    factor = 2.0
    layer = keras.layers.Dense(4, activation=lambda x: x * factor)
    layer.build((None, 3))
    assert check_signature.signature(layer, (None, 3)) is None
    plain = keras.layers.Dense(4, activation="relu")
    plain.build((None, 3))
    assert check_signature.signature(plain, (None, 3)) is not None
