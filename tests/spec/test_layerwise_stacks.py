"""layerwise_decay on models with several stacks: every layer of each its own depth.

Encoder-decoders (an encoder read by every decoder layer's cross-attention),
layers sharing a relative-position table, a second input path, and two towers
side by side; built from Keras layers here, and every keras_hub backbone a
user can build from constructor arguments (`tests/helpers/hub_zoo.py`, slow).
Each is checked for order (embeddings < encoder 0 < ... < encoder n <
decoder 0 < ... < decoder m) and against the optimizer: one `fit` step moves
every variable as stock Keras's SGD step at lr x decay**depth.
"""

import keras
import numpy as np
import pytest

import maskfit
from tests.helpers import hub_zoo
from tests.helpers import layerwise_checks as checks

pytestmark = pytest.mark.backends("tensorflow", "jax")

try:
    import keras_hub
except ImportError:  # the [hub] extra
    keras_hub = None
needs_hub = pytest.mark.skipif(
    keras_hub is None, reason="keras_hub (the [hub] extra) is not installed"
)

DECAY = 0.8
WIDTH = 8


def attention(name):
    return keras.layers.MultiHeadAttention(2, 4, name=name)


def encoder_decoder(layers=2):
    """Token ids of each side -> a shared embedding -> encoder, decoder -> head.

    Each layer is residual attention then a residual Dense, with norms; each
    decoder layer reads the encoder's output (cross-attention), so no one
    call separates the encoder's layers from the decoder's.
    """
    source = keras.Input((5,), dtype="int32", name="source_ids")
    target = keras.Input((4,), dtype="int32", name="target_ids")
    embed = keras.layers.Embedding(20, WIDTH, name="embedding")
    x = embed(source)
    for i in range(layers):
        x = keras.layers.Add()([x, attention(f"enc_{i}_attention")(x, x)])
        x = keras.layers.LayerNormalization(name=f"enc_{i}_norm")(x)
        x = keras.layers.Add()([x, keras.layers.Dense(WIDTH, name=f"enc_{i}_ffn")(x)])
    memory = x
    y = embed(target)
    for i in range(layers):
        y = keras.layers.Add()([y, attention(f"dec_{i}_self")(y, y)])
        y = keras.layers.Add()([y, attention(f"dec_{i}_cross")(y, memory)])
        y = keras.layers.Add()([y, keras.layers.Dense(WIDTH, name=f"dec_{i}_ffn")(y)])
    outputs = keras.layers.Dense(1, name="head")(keras.layers.Flatten()(y))
    model = maskfit.MaskedModel([source, target], keras.ops.squeeze(outputs, -1))
    rng = np.random.default_rng(0)
    x = [rng.integers(0, 20, (4, 5)), rng.integers(0, 20, (4, 4))]
    return model, x


def depths(plan):
    return {name: block.depth for block in plan for name in block.layers}


def test_an_encoder_decoder_gives_each_layer_of_both_stacks_its_own_depth():
    keras.utils.set_random_seed(0)
    model, x = encoder_decoder()

    plan = maskfit.layerwise_decay(model, DECAY)

    found = depths(plan)
    order = ["embedding"]
    order += [f"enc_{i}_{part}" for i in range(2) for part in ("attention", "ffn")]
    order += [f"dec_{i}_{part}" for i in range(2) for part in ("self", "cross", "ffn")]
    order += ["head"]
    assert [found[name] for name in order] == sorted(
        (found[name] for name in order), reverse=True
    ), str(plan)
    assert len(set(found[name] for name in order)) == len(order), str(plan)
    # The encoder's layers are cuts of its input only; the decoder's first
    # self-attention of its own input only (the cross-attention's residual
    # skips it); its first cross-attention of the encoder's input (the only
    # way the encoder reaches the decoder), and from there on, of both.
    rules = {name: block.rule for block in plan for name in block.layers}
    assert rules["enc_1_ffn"] == "cut of source_ids"
    assert rules["dec_0_self"] == "cut of target_ids"
    assert rules["dec_0_cross"] == "cut of source_ids"
    assert rules["dec_0_ffn"] == rules["dec_1_cross"] == "cut"
    assert "first use of embedding" in rules["embedding"]
    checks.check_sgd_step(model, x, plan)


def test_a_relative_position_table_read_by_every_layer_joins_its_first_reader():
    keras.utils.set_random_seed(0)
    tokens = keras.Input((5,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(20, WIDTH, name="embedding")(tokens)
    # Made once from the embeddings, read by every layer's attention as keys.
    table = keras.layers.Dense(WIDTH, name="relative_table")(x)
    for i in range(3):
        mixed = attention(f"layer_{i}")(x, x, key=table)
        x = keras.layers.Add()([x, mixed])
    model = maskfit.MaskedModel(tokens, keras.ops.sum(x, axis=(1, 2)))

    plan = maskfit.layerwise_decay(model, DECAY)

    found = depths(plan)
    assert [found[f"layer_{i}"] for i in range(3)] == [2, 1, 0], str(plan)
    assert found["relative_table"] == found["layer_0"]
    assert found["embedding"] == 3
    x = np.random.default_rng(0).integers(0, 20, (4, 5))
    checks.check_sgd_step(model, x, plan)


def towers():
    """Two towers of 2 and 3 Dense layers, joined by the head."""
    left_in, right_in = keras.Input((4,), name="left"), keras.Input((4,), name="right")
    left, right = left_in, right_in
    for i in range(2):
        left = keras.layers.Dense(WIDTH, name=f"left_{i}")(left)
    for i in range(3):
        right = keras.layers.Dense(WIDTH, name=f"right_{i}")(right)
    joined = keras.layers.Concatenate()([left, right])
    head = keras.layers.Dense(1, name="head")(joined)
    return maskfit.MaskedModel([left_in, right_in], keras.ops.squeeze(head, -1))


def test_parallel_stacks_count_each_tower_from_the_output():
    model = towers()

    sequential = depths(maskfit.layerwise_depths(model, DECAY))
    parallel = maskfit.layerwise_decay(model, DECAY, stacks="parallel")

    # One order: distinct depths, each tower's layers in order.
    names = [f"left_{i}" for i in range(2)] + [f"right_{i}" for i in range(3)]
    assert len({sequential[n] for n in names}) == len(names)
    assert sequential["left_0"] > sequential["left_1"] > sequential["head"]
    assert sequential["right_0"] > sequential["right_1"] > sequential["right_2"]
    # Per stack: the i-th layer from each tower's top shares a depth.
    found = depths(parallel)
    assert found["head"] == 0
    assert found["left_1"] == found["right_2"] == 1
    assert found["left_0"] == found["right_1"] == 2
    assert found["right_0"] == 3
    x = [np.ones((4, 4), "float32"), np.full((4, 4), 0.5, "float32")]
    checks.check_sgd_step(model, x, parallel)


def test_a_residual_block_is_still_one_block():
    inputs = keras.Input((4,))
    stem = keras.layers.Dense(6, name="stem")(inputs)
    branch = keras.layers.Dense(6, name="branch_b")(
        keras.layers.Dense(6, name="branch_a")(stem)
    )
    joined = keras.layers.Add()([stem, branch])
    norm = keras.layers.LayerNormalization(name="norm")(joined)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(norm))

    plan = maskfit.layerwise_depths(model, DECAY)

    assert [b.layers for b in plan] == [
        ("head",),
        ("branch_a", "branch_b", "norm"),
        ("stem",),
    ]
    assert [b.rule for b in plan] == ["cut", "cut + norms", "cut"]


def test_a_list_of_blocks_is_placed_as_given():
    model = towers()
    plan = maskfit.layerwise_depths(
        [model.get_layer("left_0"), model.get_layer("head")]
    )
    assert [(b.layers, b.rule) for b in plan] == [
        (("head",), "given"),
        (("left_0",), "given"),
    ]


@pytest.mark.parametrize(
    "stacks, error",
    [("stacked", "expected one of 'sequential', 'parallel'"), (None, "stacks=None")],
)
def test_a_bad_stacks_value_is_refused_naming_the_choices(stacks, error):
    model = towers()
    with pytest.raises(ValueError, match=error):
        maskfit.layerwise_decay(model, DECAY, stacks=stacks)
    assert all(maskfit.get_mask(x) is None for x in model.layers)


def test_stacks_with_a_list_of_blocks_is_refused():
    model = towers()
    with pytest.raises(ValueError, match="already in the order given"):
        maskfit.layerwise_decay([model.get_layer("head")], DECAY, stacks="parallel")


def check_backbone(name):
    """The tiny keras_hub backbone `name`: each of its stacks' layers a depth, in order."""
    backbone, x = hub_zoo.build(name)
    model = checks.scalar_model(backbone)
    plan = maskfit.layerwise_decay(model, DECAY)
    found = checks.depth_of_layers(model, plan)
    layers = checks.repeated_blocks(backbone)
    text = f"{name}:\n{plan}"
    if hub_zoo.CONFIGS[name][0] == "vision" and not layers:
        # Convolutional: no stack of composite blocks; a block per cut.
        assert len(plan) >= 3, text
        layers = []
    else:
        assert len(layers) >= 2, text
    by_stack = {}  # the blocks of one class in one layer or tower
    for layer in layers:
        by_stack.setdefault(checks.stack_of(model, layer), []).append(found[id(layer)])
    for seen in by_stack.values():
        # Made in order, each deeper than the next: none shares a depth.
        assert seen == sorted(seen, reverse=True) and len(set(seen)) == len(seen), text
    assert len({found[id(x)] for x in layers}) == len(layers), text
    encoder = [found[id(x)] for x in layers if "decoder" not in x.name]
    decoder = [found[id(x)] for x in layers if "decoder" in x.name]
    if decoder and encoder:
        assert min(encoder) > max(decoder), text
    embeddings = [
        found[id(x)]
        for x in backbone.layers
        if "Embedding" in type(x).__name__ and x.trainable_weights
    ]
    # An embedding sits between stacks (below the first, or between VideoPrism's
    # spatial and temporal encoders), never inside one.
    for depth in embeddings:
        for seen in by_stack.values():
            assert all(d < depth for d in seen) or all(d > depth for d in seen), text
    checks.check_sgd_step(model, x, plan)


@needs_hub
def test_keras_hubs_t5_orders_every_layer_of_both_stacks():
    # Whisper, BART, Moonshine, T5Gemma and the rest: the slow test below.
    check_backbone("T5Backbone")


@needs_hub
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(hub_zoo.CONFIGS))
def test_every_keras_hub_backbone_gives_its_layers_distinct_ordered_depths(name):
    if name not in hub_zoo.available():
        pytest.skip(f"this keras_hub has no {name}")
    check_backbone(name)


def test_the_step_check_fails_on_a_plan_one_block_off():
    # What the checks above rest on: a multiplier off by one block is caught.
    keras.utils.set_random_seed(0)
    model, x = encoder_decoder()
    plan = maskfit.layerwise_decay(model, DECAY)
    shifted = [
        block._replace(multiplier=DECAY ** (block.depth + 1))
        if block.depth == 3
        else block
        for block in plan
    ]
    with pytest.raises(AssertionError, match="at multiplier"):
        checks.check_sgd_step(model, x, shifted)


@needs_hub
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(hub_zoo.REFUSED))
def test_a_backbone_no_block_order_fits_is_refused_by_name(name):
    backbone, _ = hub_zoo.build(name)
    model = checks.scalar_model(backbone)
    with pytest.raises(ValueError, match=hub_zoo.REFUSED[name][2]) as caught:
        maskfit.layerwise_decay(model, DECAY)
    assert "Pass the blocks yourself" in str(caught.value)
    assert all(maskfit.get_mask(x) is None for x in model.layers)
