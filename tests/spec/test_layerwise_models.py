"""layerwise_decay on real architectures: each variable steps at lr x decay**depth.

keras_hub backbones (BERT, GPT-2, Llama, ViT inside a classifier, at tiny sizes
from their constructors), keras.applications ResNet50 and a nested model. The
depth of every block is read back (`layerwise_depths`), checked for order
(embeddings < layer 0 < ... < head), and checked against the optimizer: after
one `fit` step each variable equals a reference optimizer's step at
`lr * decay**depth` from the same weights and gradient.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import internals
from tests.helpers import hub_cases

try:
    import keras_hub
except ImportError:  # the [hub] extra
    keras_hub = None
needs_hub = pytest.mark.skipif(
    keras_hub is None, reason="keras_hub (the [hub] extra) is not installed"
)

DECAY = 0.8
LR = 0.1
TEXT = dict(vocabulary_size=40, num_layers=3, hidden_dim=8, intermediate_dim=16)


def tokens(batch=4, length=6, segments=False):
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(1, 40, (batch, length)).astype("int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }
    if segments:
        x["segment_ids"] = np.zeros((batch, length), "int32")
    return x


def classify(backbone, inputs, features):
    """A MaskedModel: `features(backbone outputs)` -> Dense(3) 'head'."""
    hidden = features(backbone(inputs))
    return maskfit.MaskedModel(inputs, keras.layers.Dense(3, name="head")(hidden))


def text_inputs(segments=False):
    names = ["token_ids", "padding_mask"] + (["segment_ids"] if segments else [])
    return {n: keras.Input((None,), dtype="int32", name=n) for n in names}


def bert():
    backbone = keras_hub.models.BertBackbone(
        num_heads=2, max_sequence_length=8, dropout=0.0, **TEXT
    )
    model = keras_hub.models.BertTextClassifier(
        backbone, num_classes=3, preprocessor=None, dropout=0.0
    )
    order = ["token_embedding", "transformer_layer_0", "transformer_layer_1"]
    order += ["transformer_layer_2", "pooled_dense", "logits"]
    model = maskfit.MaskedModel(model.input, model.output)
    return model, tokens(segments=True), order


def gpt2():
    backbone = keras_hub.models.GPT2Backbone(
        num_heads=2, max_sequence_length=8, dropout=0.0, **TEXT
    )
    model = classify(backbone, text_inputs(), lambda h: h[:, -1, :])
    order = ["token_embedding", "transformer_layer_0", "transformer_layer_1"]
    return model, tokens(), order + ["transformer_layer_2", "head"]


def llama():
    backbone = keras_hub.models.LlamaBackbone(
        num_query_heads=2, num_key_value_heads=1, **TEXT
    )
    model = classify(backbone, text_inputs(), lambda h: h[:, 0, :])
    order = ["token_embedding", "transformer_layer_0", "transformer_layer_1"]
    return model, tokens(), order + ["transformer_layer_2", "head"]


def vit():
    backbone = hub_cases.backbone(
        "vit", num_layers=3, num_heads=2, hidden_dim=8, mlp_dim=16
    )
    model = keras_hub.models.ViTImageClassifier(
        backbone, num_classes=3, preprocessor=None
    )
    model = maskfit.MaskedModel(model.input, model.output)
    images = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    # The encoder's blocks (named "transformer_block_i", "tranformer_block_i" in
    # keras_hub 0.25), in the order it made them.
    encoder = backbone.get_layer("vit_encoder")
    blocks = [
        x.name for x in internals.sublayers(encoder, False) if x.trainable_weights
    ]
    blocks = [n for n in blocks if "block" in n]
    assert len(blocks) == 3
    return model, images, ["vit_patching_and_embedding", *blocks, "predictions"]


def resnet():
    net = keras.applications.ResNet50(
        weights=None, input_shape=(64, 64, 3), classes=3, classifier_activation=None
    )
    model = maskfit.MaskedModel(net.input, net.output)
    images = np.random.default_rng(0).normal(size=(4, 64, 64, 3)).astype("float32")
    order = ["conv1_conv"]
    order += [
        f"conv{s}_block{b}_2_conv"
        for s, n in ((2, 3), (3, 4), (4, 6), (5, 3))
        for b in range(1, n + 1)
    ]
    return model, images, order + ["predictions"]


def nested():
    inner = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(6, name="inner_0"),
            keras.layers.Dense(6, name="inner_1"),
        ],
        name="inner",
    )
    inputs = keras.Input((5,))
    hidden = inner(keras.layers.Dense(4, name="stem")(inputs))
    skip = keras.layers.Concatenate()(
        [hidden, keras.layers.Dense(2, name="side")(hidden)]
    )
    model = maskfit.MaskedModel(inputs, keras.layers.Dense(3, name="head")(skip))
    x = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")
    return model, x, ["stem", "inner_0", "inner_1", "side", "head"]


def depth_of(plan):
    return {name: block.depth for block in plan for name in block.layers}


def multiplier_by_variable(model, plan):
    layers = {x.name: x for x in internals.sublayers(model)}
    found = {}
    for block in plan:
        for name in block.layers:
            for v in layers[name].trainable_weights:
                found.setdefault(id(v), block.multiplier)
    return found


def check_one_step(model, x, plan, make_optimizer, min_gradient=0.0, rtol=1e-3):
    """One `fit` step against a reference optimizer per multiplier, per variable.

    Entries whose gradient is below `min_gradient` are left out: Adam's first
    step divides the gradient by its size, so there the graph's and the tape's
    last-bit differences in a near-zero gradient are magnified.
    """
    y = np.array([0, 1, 2, 1][: len(next(iter(keras.tree.flatten(x))))])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_weights
    start = [v.numpy() for v in variables]
    with tf.GradientTape() as tape:
        value = loss(y, model(x, training=True))
    grads = tape.gradient(value, variables)
    model.compile(optimizer=make_optimizer(LR), loss=loss)
    model.fit(x, y, batch_size=len(y), epochs=1, shuffle=False, verbose=0)

    multipliers = multiplier_by_variable(model, plan)
    assert set(multipliers) == {id(v) for v in variables}
    groups = {}
    for v, w, g in zip(variables, start, grads):
        if g is None:  # not used by the loss (an untied output embedding)
            np.testing.assert_array_equal(v.numpy(), w)
            continue
        groups.setdefault(multipliers[id(v)], []).append((v, w, g))
    for multiplier, members in groups.items():
        refs = [keras.Variable(w) for _, w, _ in members]
        make_optimizer(float(np.float32(LR) * np.float32(multiplier))).apply(
            [g for _, _, g in members], refs
        )
        for (v, w, g), ref in zip(members, refs):
            kept = np.abs(tf.convert_to_tensor(g).numpy()) >= min_gradient
            step, expected = (v.numpy() - w)[kept], (ref.numpy() - w)[kept]
            # The step taken is the reference's to float rounding (the tape's
            # gradient and the compiled step's differ in their last bits):
            # a multiplier off by one block would be off by 1 - decay = 20%.
            error = np.linalg.norm(step - expected)
            assert error <= rtol * np.linalg.norm(expected) + 1e-7 * step.size**0.5, (
                f"{v.path} at multiplier {multiplier}: its step is"
                f" {np.linalg.norm(step):.4g}, the reference's"
                f" {np.linalg.norm(expected):.4g}, apart by {error:.3g}"
            )


def sgd(lr):
    return keras.optimizers.SGD(lr)


def adamw(lr):
    return keras.optimizers.AdamW(lr, weight_decay=0.1)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(bert, marks=needs_hub),
        pytest.param(gpt2, marks=needs_hub),
        pytest.param(llama, marks=needs_hub),
        pytest.param(vit, marks=needs_hub),
        pytest.param(resnet, marks=pytest.mark.slow),
        nested,
    ],
    ids=lambda f: getattr(f, "__name__", None),
)
def test_depths_are_ordered_and_the_optimizer_steps_at_decay_to_the_depth(build):
    keras.utils.set_random_seed(0)
    model, x, order = build()

    shown = maskfit.layerwise_depths(model, DECAY)
    plan = maskfit.layerwise_decay(model, DECAY)

    assert plan == shown
    assert [b.depth for b in plan] == list(range(len(plan)))
    depths = depth_of(plan)
    assert [depths[name] for name in order] == sorted(
        (depths[name] for name in order), reverse=True
    )
    assert len({depths[name] for name in order}) == len(order), str(plan)
    assert depths[order[-1]] == 0
    # BatchNorm over a batch of 4 magnifies the last-bit differences between
    # the tape's gradient and the compiled step's in ResNet's first layers.
    check_one_step(model, x, plan, sgd, rtol=5e-2 if build is resnet else 1e-3)


def test_resnet50_counts_its_stem_then_each_residual_block_then_the_head():
    model, _, order = resnet()
    plan = maskfit.layerwise_depths(model, 0.8)
    depths = depth_of(plan)
    assert len(plan) == 18  # stem, 16 residual blocks, head
    assert [depths[name] for name in order] == list(range(17, -1, -1))
    # A block's branch and shortcut are one block; its norms go with it.
    assert depths["conv3_block1_0_conv"] == depths["conv3_block1_3_bn"] == 13


def test_adamw_with_weight_decay_steps_each_block_at_its_own_rate():
    keras.utils.set_random_seed(0)
    model, x, _ = nested()
    plan = maskfit.layerwise_decay(model, DECAY)
    check_one_step(model, x, plan, adamw, min_gradient=1e-5)


@needs_hub
def test_gradual_unfreezing_on_a_backbone_starts_each_block_in_turn():
    keras.utils.set_random_seed(0)
    model, _, order = llama()
    plan = maskfit.layerwise_decay(model, 0.8, unfreeze_every=5)
    starts = {name: block.start for block in plan for name in block.layers}
    assert [starts[name] for name in order] == [20, 15, 10, 5, 0]


@needs_hub
def test_the_plan_prints_one_row_per_block():
    model, _, _ = bert()
    text = str(maskfit.layerwise_depths(model, 0.8))
    lines = text.splitlines()
    assert lines[0].split() == [
        "depth",
        "multiplier",
        "from",
        "step",
        "params",
        "placed",
        "by",
        "layers",
    ]
    assert lines[1].split()[:3] == ["0", "1", "0"] and lines[1].endswith("logits")
    assert lines[-1].split()[0] == "5" and "token_embedding" in lines[-1]
    assert len(lines) == 7
