"""layerwise_decay: multipliers decay**depth from the output, declared as masks."""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskfit
from maskfit.spec.layerwise import layerwise_decay

pytestmark = pytest.mark.backends("tensorflow", "jax", "torch")


def mlp(widths=(8, 8, 8), name="mlp"):
    """Input(4) -> Dense(w)... -> Dropout -> Dense(2) 'head', as a Sequential."""
    layers = [keras.Input((4,))]
    layers += [keras.layers.Dense(w, name=f"{name}_{i}") for i, w in enumerate(widths)]
    layers += [keras.layers.Dropout(0.1), keras.layers.Dense(2, name=f"{name}_head")]
    return keras.Sequential(layers, name=name)


def by_name(spec):
    """`{variable name: mask}` of an ElementMask keyed by variable paths."""
    return {path.split("/")[-1]: m for path, m in spec.masks.items()}


def multipliers(layer):
    """`{variable name: mask}` of the ElementMask on `layer`."""
    return by_name(maskfit.get_mask(layer))


def test_sequential_blocks_count_from_the_output_and_skip_layers_without_weights():
    model = mlp()
    blocks = layerwise_decay(model, 0.5)

    assert [(b.depth, b.multiplier, b.start, b.layers) for b in blocks] == [
        (0, 1.0, 0, ("mlp_head",)),
        (1, 0.5, 0, ("mlp_2",)),
        (2, 0.25, 0, ("mlp_1",)),
        (3, 0.125, 0, ("mlp_0",)),
    ]
    for block in blocks:
        layer = model.get_layer(block.layers[0])
        # One scalar per variable: no memory.
        assert multipliers(layer) == {
            "kernel": block.multiplier,
            "bias": block.multiplier,
        }
        assert all(m.shape == () for m in multipliers(layer).values())
    assert maskfit.get_mask(model.layers[3]) is None  # the Dropout


def test_a_nested_model_counts_its_own_layers_and_given_blocks_keep_it_whole():
    inputs = keras.Input((4,))
    inner = mlp(widths=(8,), name="inner")
    hidden = inner(keras.layers.Dense(4, name="a")(inputs))
    outputs = keras.layers.Dense(3, name="head")(hidden)
    model = keras.Model(inputs, outputs)

    blocks = layerwise_decay(model, 0.8)

    assert [b.layers for b in blocks] == [
        ("head",),
        ("inner_head",),
        ("inner_0",),
        ("a",),
    ]
    assert multipliers(inner.get_layer("inner_0"))["kernel"] == np.float32(0.64)

    # Given as a block, the nested model is one: its variables are declared on
    # it, each by its path.
    for layer in (inner.get_layer("inner_0"), inner.get_layer("inner_head")):
        maskfit.set_mask(layer, None)
    blocks = layerwise_decay(
        [model.get_layer("a"), inner, model.get_layer("head")], 0.8
    )

    assert [b.layers for b in blocks] == [("head",), ("inner",), ("a",)]
    assert set(maskfit.get_mask(inner).masks) == {
        v.path for v in inner.trainable_weights
    }
    assert all(
        float(m) == np.float32(0.8) for m in maskfit.get_mask(inner).masks.values()
    )
    assert multipliers(model.get_layer("a"))["kernel"] == np.float32(0.64)


def residual_model():
    inputs = keras.Input((4,))
    stem = keras.layers.Dense(6, name="stem")
    body = keras.layers.Dense(6, name="body")
    head = keras.layers.Dense(2, name="head")
    hidden = stem(inputs)
    hidden = keras.layers.Add()([hidden, body(hidden)])
    return keras.Model(inputs, head(hidden)), (stem, body, head)


def test_a_skip_connection_makes_one_block_of_its_branch_and_blocks_can_be_given():
    model, (stem, body, head) = residual_model()

    blocks = layerwise_decay(model, 0.5)

    assert [(b.depth, b.layers) for b in blocks] == [
        (0, ("head",)),
        (1, ("body",)),
        (2, ("stem",)),
    ]
    assert multipliers(stem) == {"kernel": 0.25, "bias": 0.25}

    blocks = layerwise_decay([[stem, body], head], 0.5)

    assert [(b.depth, b.layers) for b in blocks] == [
        (0, ("head",)),
        (1, ("stem", "body")),
    ]
    assert multipliers(body) == multipliers(stem) == {"kernel": 0.5, "bias": 0.5}


def test_gradual_unfreezing_freezes_each_block_until_its_turn():
    model = mlp(widths=(8, 8))
    blocks = layerwise_decay(model, 0.5, unfreeze_every=10)

    assert [(b.depth, b.start) for b in blocks] == [(0, 0), (1, 10), (2, 20)]
    assert isinstance(
        maskfit.get_mask(model.get_layer("mlp_head")), maskfit.ElementMask
    )
    schedule = maskfit.get_mask(model.get_layer("mlp_0"))
    assert schedule.boundaries == (20,)
    assert float(by_name(schedule.spec_at(19))["kernel"]) == 0.0
    assert float(by_name(schedule.spec_at(20))["kernel"]) == 0.25


def test_masks_already_declared_are_multiplied_interval_by_interval():
    model = mlp(widths=(8,))
    hidden = model.get_layer("mlp_0")
    keep = (np.arange(32).reshape(4, 8) % 2).astype("float32")
    maskfit.set_mask(hidden, maskfit.ElementMask({"kernel": keep}))
    # A warm-in declared by the user on the head: 0, 0.1 from step 5, 1 from 15.
    head = model.get_layer("mlp_head")
    warm = [
        maskfit.ElementMask({"kernel": value, "bias": value})
        for value in (0.0, 0.1, 1.0)
    ]
    maskfit.set_mask(head, maskfit.PiecewiseMask([5, 15], warm))

    layerwise_decay(model, 0.5, unfreeze_every=10)

    hidden_mask = maskfit.get_mask(hidden)
    assert hidden_mask.boundaries == (10,)
    np.testing.assert_array_equal(
        by_name(hidden_mask.spec_at(10))["kernel"], keep * 0.5
    )
    np.testing.assert_array_equal(by_name(hidden_mask.spec_at(0))["kernel"], keep * 0)
    assert float(by_name(hidden_mask.spec_at(10))["bias"]) == 0.5
    head_mask = maskfit.get_mask(head)
    assert head_mask.boundaries == (5, 15)
    assert [float(by_name(head_mask.spec_at(s))["kernel"]) for s in (0, 5, 15)] == [
        0.0,
        np.float32(0.1),
        1.0,
    ]


def test_calling_it_again_replaces_its_own_factor():
    model = mlp(widths=(8,))
    hidden = model.get_layer("mlp_0")
    keep = np.ones((4, 8), "float32") * [0, 1, 1, 1, 1, 1, 1, 1]
    maskfit.set_mask(hidden, maskfit.ElementMask({"kernel": keep}))
    layerwise_decay(model, 0.5)
    layerwise_decay(model, 0.9)
    np.testing.assert_allclose(multipliers(hidden)["kernel"], keep * 0.9)
    # A mask you set in between is yours: it gets multiplied.
    maskfit.set_mask(hidden, maskfit.ElementMask({"kernel": keep}))
    layerwise_decay(model, 0.5)
    np.testing.assert_allclose(multipliers(hidden)["kernel"], keep * 0.5)


def test_a_nested_layer_with_its_own_mask_keeps_it_times_the_block_factor():
    inner = mlp(widths=(8,), name="inner")
    maskfit.set_mask(inner.get_layer("inner_0"), maskfit.ElementMask({"kernel": 0.5}))
    inputs = keras.Input((4,))
    head = keras.layers.Dense(2, name="head")
    keras.Model(inputs, head(inner(inputs)))

    layerwise_decay([inner, head], 0.5)

    assert multipliers(inner.get_layer("inner_0")) == {"kernel": 0.25, "bias": 0.5}
    # The container covers the rest of its variables, not those.
    head = inner.get_layer("inner_head")
    assert set(maskfit.get_mask(inner).masks) == {
        v.path for v in head.trainable_weights
    }


@pytest.mark.parametrize("decay", [0, -0.5, 1.5, float("nan"), True, "0.5", None])
def test_a_decay_out_of_range_is_refused(decay):
    with pytest.raises(ValueError, match=r"`decay`, expected a number in \(0, 1\]"):
        layerwise_decay(mlp(), decay)


@pytest.mark.parametrize("steps", [0, -3, 2.5, True, "10"])
def test_unfreeze_every_must_be_a_positive_integer(steps):
    with pytest.raises(
        ValueError, match="`unfreeze_every`, expected None or a positive"
    ):
        layerwise_decay(mlp(), 0.5, unfreeze_every=steps)


def test_models_and_blocks_it_cannot_read_are_refused_with_the_fix():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model(np.zeros((1, 4), "float32"))
    with pytest.raises(ValueError, match="cannot tell the depth.*Pass its blocks"):
        layerwise_decay(model, 0.5)
    unbuilt = keras.Sequential([keras.layers.Dense(3), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="is not built yet"):
        layerwise_decay(unbuilt, 0.5)
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    with pytest.raises(
        ValueError, match=f"'{dense.name}' is in block 0 and in block 1"
    ):
        layerwise_decay([dense, [dense]], 0.5)
    with pytest.raises(TypeError, match="not a Keras layer"):
        layerwise_decay([dense, "head"], 0.5)
    with pytest.raises(TypeError, match="expects a keras.Sequential"):
        layerwise_decay(dense, 0.5)
    with pytest.raises(ValueError, match="empty list"):
        layerwise_decay([], 0.5)


def test_a_layer_with_an_output_mask_is_refused_and_nothing_is_declared():
    model = mlp(widths=(8,))
    maskfit.set_mask(model.get_layer("mlp_0"), maskfit.OutputMask([1, 0] * 4))
    with pytest.raises(ValueError, match="'mlp_0' carries OutputMask.*ElementMask"):
        layerwise_decay(model, 0.5)
    assert maskfit.get_mask(model.get_layer("mlp_head")) is None


def test_a_layer_inside_another_block_is_refused():
    inner = mlp(widths=(8,), name="inner")
    with pytest.raises(ValueError, match="'inner_0' is in block 0 and in block 1"):
        layerwise_decay([inner, inner.get_layer("inner_0")], 0.5)


@settings(max_examples=15, deadline=None)
@given(depth=st.integers(1, 5), decay=st.floats(0.05, 1.0))
def test_every_block_gets_decay_to_the_power_of_its_depth(depth, decay):
    model = mlp(widths=(3,) * (depth - 1))
    blocks = layerwise_decay(model, decay)
    assert len(blocks) == depth
    for block in blocks:
        assert block.multiplier == decay**block.depth
        mask = maskfit.get_mask(model.get_layer(block.layers[0]))
        assert all(
            float(m) == np.float32(decay**block.depth) for m in mask.masks.values()
        )


def test_blocks_waiting_to_unfreeze_do_not_move_in_training():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="tanh", name="a")(inputs)
    hidden = keras.layers.Dense(8, activation="tanh", name="b")(hidden)
    model = maskfit.MaskedModel(inputs, keras.layers.Dense(2, name="head")(hidden))
    layerwise_decay(model, 0.5, unfreeze_every=3)
    model.compile(optimizer=keras.optimizers.AdamW(0.01), loss="mse")
    x = np.random.default_rng(0).normal(size=(24, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(24, 2)).astype("float32")
    start = {n: model.get_layer(n).kernel.numpy() for n in ("a", "b", "head")}

    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)  # steps 0-2

    moved = {n: np.any(model.get_layer(n).kernel.numpy() != start[n]) for n in start}
    assert moved == {"a": False, "b": False, "head": True}
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)  # steps 3-5
    np.testing.assert_array_equal(model.get_layer("a").kernel.numpy(), start["a"])
    assert np.any(model.get_layer("b").kernel.numpy() != start["b"])


def test_every_block_trains_at_its_multiplier():
    # Multipliers below 1 still learn, in the masked step: each block moves.
    model = maskfit.MaskedSequential([keras.Input((4,))] + mlp(widths=(6,)).layers)
    layerwise_decay(model, 0.5)
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1), loss="mse")
    before = {v.path: np.array(v) for v in model.weights}
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    moved = {p for p, v in before.items() if np.any(v != _value(model, p))}
    assert moved == set(before)


def _value(model, path):
    return next(np.array(v) for v in model.weights if v.path == path)


def test_the_docstring_example_runs():
    import doctest

    from maskfit.spec import layerwise

    results = doctest.testmod(layerwise, extraglobs=dict(keras=keras, maskfit=maskfit))
    assert results.attempted > 0 and results.failed == 0
