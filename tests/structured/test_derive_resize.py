"""`shrink` of a layer whose coupling is derived: its config searched, then checked.

A user's subclassed gated MLP (no spec, no declaration: its units are read
from its computation) shrinks to the cut shapes with outputs equal to the
masked model's; a layer whose hidden width is computed from a ratio (no
config field holds it) keeps its size and warns naming the fields tried;
identical blocks search once. The layers are defined here, at module level,
so that under TensorFlow a JAX worker process can import them to derive
their couplings.
"""

import warnings

import keras
import numpy as np
import pytest
from keras import ops

import maskfit.pruning as pruning
from maskfit.structured.derive import resize
from tests.helpers import derived_blocks as blocks
from tests.helpers import hub_cases

pytestmark = pytest.mark.backends("tensorflow", "jax")

WIDTH, SEQUENCE = 8, 3


class GatedMLP(keras.layers.Layer):
    """`down(silu(gate(x)) * up(x))`: `hidden` units, `units` outputs."""

    def __init__(self, units=WIDTH, hidden=6, **kwargs):
        super().__init__(**kwargs)
        self.units, self.hidden = units, hidden

    def get_config(self):
        return {**super().get_config(), "units": self.units, "hidden": self.hidden}

    def build(self, shape):
        self.gate = keras.layers.Dense(self.hidden, use_bias=False, name="gate")
        self.up = keras.layers.Dense(self.hidden, name="up")
        self.down = keras.layers.Dense(self.units, name="down")
        self.gate.build(shape)
        self.up.build(shape)
        self.down.build(tuple(shape[:-1]) + (self.hidden,))

    def call(self, x):
        return self.down(ops.silu(self.gate(x)) * self.up(x))


class RatioMLP(GatedMLP):
    """A `GatedMLP` whose hidden width is `expansion` times its output width."""

    def __init__(self, units=WIDTH, expansion=1, **kwargs):
        super().__init__(units=units, hidden=units * expansion, **kwargs)
        self.expansion = expansion

    def get_config(self):
        config = super().get_config()
        del config["hidden"]
        return {**config, "expansion": self.expansion}


class SplitHeadsAttention(keras.layers.Layer):
    """Attention whose head size is computed: `width // heads` (keras_hub's CLIP,
    Whisper, OPT...), so no config field says "fewer heads of the same size"."""

    def __init__(self, width=WIDTH, heads=2, **kwargs):
        super().__init__(**kwargs)
        self.width, self.heads = width, heads

    def get_config(self):
        return {**super().get_config(), "width": self.width, "heads": self.heads}

    def build(self, shape):
        size = self.width // self.heads
        self.projections = [
            keras.layers.EinsumDense(
                "btd,dnh->btnh", (None, self.heads, size), name=name
            )
            for name in ("query", "key", "value")
        ]
        self.output_dense = keras.layers.EinsumDense(
            "btnh,nhd->btd", (None, self.width), name="attention_output"
        )
        for dense in self.projections:
            dense.build(shape)
        self.output_dense.build(tuple(shape[:2]) + (self.heads, size))

    def call(self, x):
        q, k, v = (dense(x) for dense in self.projections)
        scores = ops.softmax(ops.einsum("bqnh,bknh->bnqk", q, k), axis=-1)
        return x + self.output_dense(ops.einsum("bnqk,bknh->bqnh", scores, v))


def _model(*blocks):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((SEQUENCE, WIDTH))
    x = inputs
    for block in blocks:
        x = block(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(x))


def _inputs():
    return np.random.default_rng(1).normal(size=(2, SEQUENCE, WIDTH)).astype("float32")


def _shrunk(model, fraction=0.5):
    selection = pruning.select_units(model, fraction)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small = pruning.shrink(model, selection)
    said = [str(w.message) for w in caught if "shrink:" in str(w.message)]
    return selection, small, said


@pytest.fixture(autouse=True)
def _fresh_search(monkeypatch):
    """Each test searches anew (the outcomes are kept per process)."""
    monkeypatch.setattr(resize, "_FOUND", {})


def test_a_custom_gated_mlp_shrinks_with_the_masked_outputs():
    model = _model(GatedMLP(name="mlp"))
    selection, small, said = _shrunk(model)
    assert said == []
    mlp = small.get_layer("mlp")
    assert type(mlp) is GatedMLP and (mlp.units, mlp.hidden) == (WIDTH, 3)
    shapes = {v.path: tuple(v.shape) for v in mlp.weights}
    assert shapes == {
        "mlp/gate/kernel": (WIDTH, 3),
        "mlp/up/kernel": (WIDTH, 3),
        "mlp/up/bias": (3,),
        "mlp/down/kernel": (3, WIDTH),
        "mlp/down/bias": (WIDTH,),
    }
    # The kept units' entries, exactly.
    kept = selection.graph.kept_positions(
        selection.graph.slices_of(model.get_layer("mlp").up.kernel).axes[1],
        selection.kept,
    )
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(mlp.up.kernel),
        keras.ops.convert_to_numpy(model.get_layer("mlp").up.kernel)[:, kept],
    )
    x = _inputs()
    hub_cases.assert_close(
        hub_cases.outputs(small, x), hub_cases.masked_outputs(selection, x)
    )


def test_a_width_no_config_field_holds_keeps_its_size_and_says_what_was_tried():
    # hidden = units * expansion: halving `units` (the one integer equal to
    # the hidden width) also halves the output, so no candidate passes.
    model = _model(RatioMLP(name="mlp"))
    selection, small, said = _shrunk(model)
    assert len(said) == 1, said
    assert "layer 'mlp' (RatioMLP) keeps its size" in said[0]
    assert "no config field that was tried (units)" in said[0]
    assert small.count_params() == model.count_params()
    x = _inputs()
    np.testing.assert_allclose(
        hub_cases.outputs(small, x), hub_cases.masked_outputs(selection, x), atol=1e-6
    )


# About 3 s once the file's first test has started the JAX worker.
def test_heads_of_a_computed_size_stay_and_the_warning_says_which_and_why():
    # head size = width // heads: heads=1 gives heads of 8, not one head of 4.
    model = _model(SplitHeadsAttention(name="attention"))
    selection, small, said = _shrunk(model)
    assert [len(ids) for ids in selection.removed()["attention"].values()] == [1]
    assert len(said) == 1, said
    assert "layer 'attention' (SplitHeadsAttention) keeps its size" in said[0]
    assert (
        "its heads (1 of 2 removed) stay: the cut needs weight 'query/kernel' of"
        f" shape ({WIDTH}, 1, 4) (axis 1: 2 -> 1), and no config field that was"
        f" tried gives it: heads=1 gave ({WIDTH}, 1, {WIDTH})"
    ) in said[0]
    assert (
        f"(heads=1 cuts axis 1 but makes axis 2 {WIDTH} long, not 4: that length"
        " is computed from heads"
    ) in said[0]
    assert small.count_params() == model.count_params()
    x = _inputs()
    hub_cases.assert_close(
        hub_cases.outputs(small, x), hub_cases.masked_outputs(selection, x)
    )


def test_identical_blocks_search_once(monkeypatch):
    calls = []
    search = resize._search
    monkeypatch.setattr(
        resize, "_search", lambda *args: calls.append(1) or search(*args)
    )
    model = _model(*[GatedMLP(name=f"mlp_{i}") for i in range(3)])
    # Each block keeps 3 of its 6 units: one signature, one search.
    selection = pruning.select_units(model, 0.5)
    removed = selection.removed()
    assert [len(removed[f"mlp_{i}"]["units"]) for i in range(3)] == [3, 3, 3]
    small = pruning.shrink(model, selection)
    assert len(calls) == 1
    assert [small.get_layer(f"mlp_{i}").hidden for i in range(3)] == [3, 3, 3]
    x = _inputs()
    hub_cases.assert_close(
        hub_cases.outputs(small, x), hub_cases.masked_outputs(selection, x)
    )


def test_a_search_builds_at_most_max_candidates(monkeypatch):
    built = []
    make = resize._built
    monkeypatch.setattr(resize, "_built", lambda *args: built.append(1) or make(*args))
    monkeypatch.setattr(resize, "MAX_CANDIDATES", 0)
    model = _model(GatedMLP(name="mlp"))
    _, small, said = _shrunk(model)
    assert built == [] and small.count_params() == model.count_params()
    assert "no config field that was tried (hidden)" in said[0]


# About 15 s on 2 loaded cores (the attention block's derivation and check).
@pytest.mark.slow
def test_a_config_with_the_right_shapes_but_other_outputs_is_refused():
    # Fused projections of heads x head_dim columns: halving `head_dim`
    # gives every weight its cut shape, but other heads; the output check
    # refuses it, and fewer heads and key/value heads pass.
    model, _ = blocks.build(blocks.GroupedAttention, fused=True)
    selection, small, said = _shrunk(model)
    assert said == []
    block = small.get_layer("block")
    assert (block.heads, block.kv_heads, block.head_dim) == (2, 1, 4)
    x = np.random.default_rng(1).normal(size=(2, blocks.SEQUENCE, blocks.HIDDEN))
    x = x.astype("float32")
    hub_cases.assert_close(
        hub_cases.outputs(small, x), hub_cases.masked_outputs(selection, x)
    )
