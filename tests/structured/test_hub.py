"""Structured pruning of keras_hub backbones: heads, grouped-query attention, FFN units.

Tiny configs built from constructor arguments (`hub_cases`). Each backbone
prunes about half its heads and FFN units one-shot (`select_units`) and
gradually in `fit` (`prune_units`), and `shrink` gives outputs equal to the
masked model's (rtol 1e-5 of the output's scale), as a functional model and,
with `uniform=True`, as a keras_hub class that loads without maskfit.
"""

import time

import keras
import numpy as np
import pytest

import maskfit.pruning as pruning
from maskfit.structured.hub import couplings as couplings_hub
from tests.helpers import hub_cases

keras_hub = pytest.importorskip("keras_hub")
# keras-hub 0.32 is the release these tests are written against; 0.25 (the
# oldest pair's) has no head_dim on Mistral's block, so a Llama's heads stay
# there (explain() says why), and reads tied embeddings differently.
pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in keras_hub.__version__.split(".")[:2]) < (0, 32),
    reason=f"keras-hub {keras_hub.__version__}: these tests need 0.32",
)

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

TRANSFORMERS = ["llama", "gemma", "bert", "gpt2", "vit"]


def _blocks(graph):
    return [s for s in graph.spaces if couplings_hub.hub_class_name(s.layer)]


def test_llama_heads_go_by_key_value_group():
    model, _ = hub_cases.build("llama")
    graph = pruning.DependencyGraph(model)
    block = model.get_layer("transformer_layer_0")
    heads = graph.own_space(block, "heads")
    units = graph.own_space(block, "units")
    assert (heads.size, heads.kind, units.size) == (2, "heads", 32)
    query = next(v for v in block.weights if v.path.endswith("query/kernel"))
    key = next(v for v in block.weights if v.path.endswith("key/kernel"))
    # 4 query heads in 2 groups: query heads 0, 1 read key/value head 0.
    np.testing.assert_array_equal(
        graph.slices_of(query).axes[1] - heads.first, [0, 0, 1, 1]
    )
    np.testing.assert_array_equal(graph.slices_of(key).axes[1] - heads.first, [0, 1])
    text = graph.explain("token_embedding")
    assert "tied" in text and "residual width" in text


# The check takes gradients with the backend that runs the block: under JAX a
# TensorFlow tape saw nothing and passed any coupling.
@pytest.mark.backends("tensorflow", "jax", "torch")
def test_llama_gradient_check_finds_a_wrong_coupling(monkeypatch):
    model, _ = hub_cases.build("llama")
    spec = couplings_hub.SPECS["LlamaTransformerDecoder"]
    wrong = spec._replace(ffn_in=(("feedforward_gate_dense",),))  # up left out
    monkeypatch.setitem(couplings_hub.SPECS, "LlamaTransformerDecoder", wrong)
    text = pruning.DependencyGraph(model).explain("transformer_layer_0")
    assert "32 stay" in text and "gradient check" in text
    assert "feedforward_intermediate_dense/kernel" in text


@pytest.mark.backends("tensorflow", "torch")
def test_llama_one_shot_shrinks_into_its_twin(tmp_path):
    model, inputs = hub_cases.build("llama")
    selection = pruning.select_units(model, 0.5)
    removed = selection.removed()
    assert all(len(removed[n]["heads"]) == 1 for n in removed)
    assert all(len(removed[n]["units"]) == 16 for n in removed)
    expected = hub_cases.masked_outputs(selection, inputs)
    functional = pruning.shrink(model, selection)
    hub_cases.assert_close(hub_cases.outputs(functional, inputs), expected)
    same = pruning.shrink(model, selection, uniform=True)
    # LlamaBackbone cannot write a head size: its Mistral twin can.
    assert type(same).__name__ == "MistralBackbone"
    config = same.get_config()
    assert (config["num_query_heads"], config["num_key_value_heads"]) == (2, 1)
    assert (config["intermediate_dim"], config["head_dim"]) == (16, 4)
    hub_cases.assert_close(hub_cases.outputs(same, inputs), expected)
    ratio = hub_cases.block_params(same) / hub_cases.block_params(model)
    assert ratio <= 0.6, ratio


def test_llama_ffn_only_keeps_the_llama_class():
    model, inputs = hub_cases.build("llama")
    heads = [f"transformer_layer_{i}" for i in range(2)]
    graph = pruning.DependencyGraph(model)
    units = {name: {"units": list(range(0, 32, 2))} for name in heads}
    selection = pruning.UnitSelection.removing(graph, units)
    small = pruning.shrink(model, selection, uniform=True)
    assert type(small) is type(model)
    assert small.get_config()["intermediate_dim"] == 16
    expected = hub_cases.masked_outputs(selection, inputs)
    hub_cases.assert_close(hub_cases.outputs(small, inputs), expected)


def test_llama_twin_computes_as_llama():
    model, inputs = hub_cases.build("llama")
    twin = hub_cases.backbone(
        "llama", "MistralBackbone", sliding_window=None, head_dim=4
    )
    for source, target in zip(model.weights, twin.weights):
        target.assign(source)
    np.testing.assert_allclose(
        hub_cases.outputs(twin, inputs), hub_cases.outputs(model, inputs), atol=1e-6
    )


def test_uniform_refuses_unequal_blocks():
    model, _ = hub_cases.build("llama")
    selection = pruning.UnitSelection.removing(
        model, {"transformer_layer_0": {"units": [0, 1]}}
    )
    with pytest.raises(ValueError, match="as many heads and FFN units"):
        pruning.shrink(model, selection, uniform=True)


def test_llama_causal_lm_shrinks_with_its_backbone():
    backbone, inputs = hub_cases.build("llama")
    lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    pruned = pruning.prune_units(
        lm, pruning.ConstantSparsity(0.5, begin_step=1, end_step=1, frequency=1)
    )
    pruned.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    pruned.fit(inputs, inputs["token_ids"], epochs=2, verbose=0)
    small = pruning.shrink(pruned, uniform=True)
    assert type(small).__name__ == "MistralCausalLM"
    assert type(small.backbone).__name__ == "MistralBackbone"
    hub_cases.assert_close(
        hub_cases.outputs(small, inputs), hub_cases.outputs(pruned, inputs)
    )


@pytest.mark.parametrize(
    "uniform",
    [True, pytest.param(False, marks=pytest.mark.slow)],
    ids=["uniform", "functional"],
)
def test_llama_fit_prunes_gradually_and_loads_without_maskfit(tmp_path, uniform):
    model, inputs = hub_cases.build("llama")
    pruned = pruning.prune_units(
        model, pruning.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=4, frequency=1)
    )
    pruned.compile(optimizer="adam", loss="mse")
    target = np.zeros((2, hub_cases.SEQUENCE, 16), "float32")
    pruned.fit(inputs, target, epochs=6, batch_size=2, verbose=0)
    removed = pruning.unit_selection(pruned).removed()
    assert [len(removed[n]["heads"]) for n in sorted(removed)] == [1, 1]
    assert [len(removed[n]["units"]) for n in sorted(removed)] == [16, 16]
    small = pruning.shrink(pruned, uniform=uniform)
    expected = hub_cases.outputs(pruned, inputs)
    hub_cases.assert_close(hub_cases.outputs(small, inputs), expected)
    small.save(tmp_path / "small.keras")
    hub_cases.save_inputs(inputs, tmp_path / "inputs.npz")
    np.save(tmp_path / "expected.npy", expected)
    loaded = hub_cases.loads_without_maskfit(
        tmp_path / "small.keras", tmp_path / "inputs.npz", tmp_path / "expected.npy"
    )
    assert loaded == ("MistralBackbone" if uniform else "Functional")


# name: the class shrink(uniform=True) gives at half the heads and FFN units
# (None: the blocks' class derives its head size, so only uniform=False
# shrinks their heads, into stock Keras layers), with FFN units only.
BACKBONES = {
    "llama": ("MistralBackbone", "LlamaBackbone"),
    "gemma": ("GemmaBackbone", "GemmaBackbone"),
    "bert": (None, "BertBackbone"),
    "gpt2": (None, "GPT2Backbone"),
    "vit": (None, "ViTBackbone"),
}


_REFUSED_HEADS = "derives its head size from hidden_dim // num_heads"


def _shrinks_uniformly(name, model, selection, expected, inputs):
    uniform_class = BACKBONES[name][0]
    if uniform_class is None:
        with pytest.raises(ValueError, match="derive their head size"):
            pruning.shrink(model, selection, uniform=True)
        return None
    same = pruning.shrink(model, selection, uniform=True)
    assert type(same).__name__ == uniform_class
    hub_cases.assert_close(hub_cases.outputs(same, inputs), expected)
    return same


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_backbone_one_shot_half(name):
    model, inputs = hub_cases.build(name)
    started = time.perf_counter()
    selection = pruning.select_units(model, 0.5)
    removed = selection.removed()
    for space in _blocks(selection.graph):
        gone = removed.get(space.layer.name, {}).get(space.name, [])
        assert len(gone) == space.size // 2, (space, gone)
    expected = hub_cases.masked_outputs(selection, inputs)
    small = pruning.shrink(model, selection)
    hub_cases.assert_close(hub_cases.outputs(small, inputs), expected)
    same = _shrinks_uniformly(name, model, selection, expected, inputs)
    ratio = hub_cases.block_params(same or small) / hub_cases.block_params(model)
    seconds = time.perf_counter() - started
    print(f"{name}: params {ratio:.3f} of dense, select+shrink {seconds:.1f} s")
    assert ratio <= 0.6, ratio


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_backbone_ffn_only_keeps_its_class(name):
    model, inputs = hub_cases.build(name)
    graph = pruning.DependencyGraph(model)
    units = {}
    for space in _blocks(graph):
        if space.kind == "units":
            chosen = list(range(0, space.size, 2))
            units.setdefault(space.layer.name, {})[space.name] = chosen
    selection = pruning.UnitSelection.removing(graph, units)
    same = pruning.shrink(model, selection, uniform=True)
    assert type(same).__name__ == BACKBONES[name][1]
    expected = hub_cases.masked_outputs(selection, inputs)
    hub_cases.assert_close(hub_cases.outputs(same, inputs), expected)


@pytest.mark.parametrize("name", sorted(BACKBONES) + ["resnet"])
def test_backbone_prunes_in_fit(name):
    model, inputs = hub_cases.build(name)
    pruned = pruning.prune_units(
        model, pruning.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=3, frequency=1)
    )
    expected_shapes = [tuple(y.shape) for y in keras.tree.flatten(model(inputs))]
    targets = [np.zeros(s, "float32") for s in expected_shapes]
    pruned.compile(optimizer="adam", loss=["mse"] * len(targets))
    pruned.fit(inputs, targets if len(targets) > 1 else targets[0], epochs=4, verbose=0)
    selection = pruning.unit_selection(pruned)
    assert selection.removed()
    expected = hub_cases.outputs(pruned, inputs)
    small = pruning.shrink(pruned)
    hub_cases.assert_close(hub_cases.outputs(small, inputs), expected)
    if name != "resnet":
        _shrinks_uniformly(name, pruned, selection, expected, inputs)


@pytest.mark.parametrize(
    "name, uniform",
    [
        pytest.param(n, u, marks=pytest.mark.slow)
        for n, u in [
            ("gemma", True),
            ("bert", False),
            ("gpt2", False),
            ("resnet", False),
        ]
    ]
    + [
        pytest.param(
            "vit",
            False,
            marks=[
                pytest.mark.slow,
                pytest.mark.xfail(
                    strict=True,
                    reason="keras_hub 0.32's ViTPatchingAndEmbedding.get_config writes"
                    " num_patches, which its __init__ refuses: a functional model"
                    " holding it does not load (ViTBackbone's own config does)",
                ),
            ],
        )
    ],
)
def test_backbone_shrunk_loads_without_maskfit(tmp_path, name, uniform):
    model, inputs = hub_cases.build(name)
    selection = pruning.select_units(model, 0.5)
    small = pruning.shrink(model, selection, uniform=uniform)
    expected = hub_cases.masked_outputs(selection, inputs)
    small.save(tmp_path / "small.keras")
    hub_cases.save_inputs(inputs, tmp_path / "inputs.npz")
    np.save(tmp_path / "expected.npy", expected)
    loaded = hub_cases.loads_without_maskfit(
        tmp_path / "small.keras", tmp_path / "inputs.npz", tmp_path / "expected.npy"
    )
    assert loaded == type(small).__name__


@pytest.mark.parametrize("name, heads", [("mistral", True), ("qwen", False)])
def test_other_decoders(name, heads):
    model, inputs = hub_cases.build(name)
    selection = pruning.select_units(model, 0.5)
    removed = selection.removed()["transformer_layer_0"]
    assert len(removed["units"]) == 16
    assert len(removed.get("heads", [])) == (1 if heads else 0)
    if not heads:  # Qwen derives its head size and has no twin: they stay
        assert _REFUSED_HEADS in selection.graph.explain("transformer_layer_0")
    expected = hub_cases.masked_outputs(selection, inputs)
    for uniform in (False, True):
        small = pruning.shrink(model, selection, uniform=uniform)
        hub_cases.assert_close(hub_cases.outputs(small, inputs), expected)
    assert type(small) is type(model)


@pytest.mark.other_modes_slow
def test_llama_removed_entries_stay_zero_in_every_mode(mode):
    model, inputs = hub_cases.build("llama")
    pruned = pruning.prune_units(
        model, pruning.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=2, frequency=1)
    )
    pruned.compile(optimizer="adamw", loss="mse", **mode)
    target = np.ones((2, hub_cases.SEQUENCE, 16), "float32")
    pruned.fit(inputs, target, epochs=4, batch_size=2, verbose=0)
    selection = pruning.unit_selection(pruned)
    graph = selection.graph
    checked = 0
    for entry in graph.sliced_variables(trainable=True):
        value = keras.ops.convert_to_numpy(entry.variable)
        for axis, ids in entry.axes.items():
            gone = ~graph.kept_positions(ids, selection.kept)
            removed = np.compress(gone, value, axis=axis)
            np.testing.assert_array_equal(removed, np.zeros_like(removed))
            checked += removed.size
    assert checked > 0
    hub_cases.assert_close(
        hub_cases.outputs(pruning.shrink(pruned, uniform=True), inputs),
        hub_cases.outputs(pruned, inputs),
    )


def test_cached_multi_head_attention_in_a_functional_graph():
    inputs = keras.Input((5, 8))
    hidden = keras.layers.Dense(8, name="hidden")(inputs)
    layer = keras_hub.layers.CachedMultiHeadAttention(
        num_heads=4, key_dim=3, name="att"
    )
    model = keras.Model(inputs, keras.layers.Dense(2)(layer(hidden, hidden)))
    text = pruning.DependencyGraph(model).explain("att")
    assert "4 heads (heads): all removable" in text
    selection = pruning.select_units(model, 0.5)
    assert len(selection.removed()["att"]["heads"]) == 2
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    small = pruning.shrink(model, selection)
    assert small.get_layer("att").num_heads == 2
    hub_cases.assert_close(
        hub_cases.outputs(small, x), hub_cases.masked_outputs(selection, x)
    )


def test_gradient_check_has_no_false_cut_on_a_wider_block():
    # 176k gate entries: a live gradient passes near 0 by chance; only an
    # exact 0 is a cut (this once kept the heads of such a block).
    model = hub_cases.backbone(
        "llama",
        vocabulary_size=100,
        num_layers=1,
        num_query_heads=8,
        hidden_dim=256,
        intermediate_dim=688,
    )
    text = pruning.DependencyGraph(model).explain("transformer_layer_0")
    assert "2 heads (heads): all removable" in text, text
    assert "688 units (units): all removable" in text, text


def test_llama3_shrinks_into_the_twin_too():
    model = hub_cases.backbone("llama3")
    _, inputs = hub_cases.build("llama")
    lm = keras_hub.models.Llama3CausalLM(backbone=model, preprocessor=None)
    selection = pruning.select_units(lm, 0.5)
    small = pruning.shrink(lm, selection, uniform=True)
    assert type(small).__name__ == "MistralCausalLM"
    hub_cases.assert_close(
        hub_cases.outputs(small, inputs), hub_cases.masked_outputs(selection, inputs)
    )


def test_uniform_needs_a_keras_hub_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8)])
    with pytest.raises(ValueError, match="rebuilds a keras_hub model's own class"):
        pruning.shrink(model, uniform=True)


def test_the_blocks_written_out_as_stock_layers_each_have_a_builder():
    from maskfit.structured.hub import couplings as couplings_hub
    from maskfit.structured.hub import stock as hub_stock

    assert set(hub_stock.BUILDERS) == set(couplings_hub.STOCK)


def test_a_decoder_with_cross_attention_called_by_keyword_shrinks():
    # BART's decoder blocks: every tensor by keyword, which Keras lists by name
    # (the padding mask first); the residual stream is `decoder_sequence`.
    keras.utils.set_random_seed(0)
    tokens, memory = keras.Input((5, 8)), keras.Input((4, 8))
    padding = keras.Input((5,), dtype="int32")
    decoder = keras_hub.layers.TransformerDecoder(
        intermediate_dim=16, num_heads=2, name="decoder"
    )
    hidden = decoder(
        decoder_sequence=keras.layers.Dense(8, name="embed")(tokens),
        encoder_sequence=memory,
        decoder_padding_mask=padding,
    )
    model = keras.Model([tokens, memory, padding], keras.layers.Dense(2)(hidden))
    selection = pruning.select_units(model, 0.5)
    removed = selection.removed()["decoder"]
    assert (len(removed["heads"]), len(removed["units"])) == (1, 8)
    rng = np.random.default_rng(0)
    x = [
        rng.normal(size=(2, 5, 8)).astype("float32"),
        rng.normal(size=(2, 4, 8)).astype("float32"),
        np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32"),
    ]
    small = pruning.shrink(model, selection)
    assert small.get_layer("decoder_self_attention").num_heads == 1
    assert small.get_layer("decoder_cross_attention").num_heads == 2
    hub_cases.assert_close(
        hub_cases.outputs(small, x), hub_cases.masked_outputs(selection, x)
    )
