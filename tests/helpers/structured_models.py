"""Small models covering every coupled layer kind and structure, for structured pruning's tests.

Each factory returns `(model, inputs)`: a built functional (or Sequential)
model whose weights are random (so removed units matter), and a batch of
inputs for it; kinds with the same role share a model (one branch each).
`masked_outputs` runs a model with the removed units' entries set to 0, as
training with `prune_units` leaves them; `shrink` must give the same
outputs. `run` calls a model, under XLA where this CPU's TensorFlow runs a
layer of it only so (channels_first convolutions).
"""

import keras
import numpy as np
import tensorflow as tf

from maskfit.structured.scoring import choice as unit_choice
from tests.helpers.keras_versions import call_or_xla

L = keras.layers


def randomize(model, seed=0):
    """Random weights (positive variances), so every unit's entries matter."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if "float" not in str(variable.dtype):
            continue
        shape = tuple(variable.shape)
        value = rng.normal(size=shape) * 0.5
        if "variance" in variable.name:
            value = np.abs(value) + 0.5
        variable.assign(value.astype(variable.dtype))
    return model


def masked_outputs(model, selection, x):
    """`model(x)` with the removed units' entries set to 0 (weights put back after)."""
    plan = unit_choice.UnitPlan(selection.graph)
    keep = tf.constant(selection.kept)
    saved = [keras.ops.convert_to_numpy(v) for v in model.weights]
    try:
        for each in plan.variables:
            mask = np.asarray(unit_choice.keep_mask(plan, keep, each.variable))
            value = keras.ops.convert_to_numpy(each.variable)
            each.variable.assign(np.where(mask, value, np.zeros_like(value)))
        return run(model, x)
    finally:
        for variable, value in zip(model.weights, saved):
            variable.assign(value)


def run(model, x):
    """`model(x, training=False)` as numpy arrays (compiled with XLA where it must be)."""
    return keras.tree.map_structure(
        keras.ops.convert_to_numpy, call_or_xla(lambda: model(x, training=False))
    )


def _x(shape, seed=1, integers=None):
    rng = np.random.default_rng(seed)
    if integers is not None:
        return rng.integers(0, integers, size=shape).astype("int32")
    return rng.normal(size=shape).astype("float32")


def functional(inputs, outputs, seed=0):
    return randomize(keras.Model(inputs, outputs), seed)


# -------------------------------------------------------------- factories


def _head(branches, inputs, xs):
    """A model whose branches are concatenated into a Dense head."""
    h = branches[0] if len(branches) == 1 else L.Concatenate(name="branches")(branches)
    return functional(inputs, L.Dense(2, name="head")(h)), xs


def mlp():
    x = keras.Input((6,))
    h = L.Dense(8, activation="relu", name="hidden")(x)
    h = L.Dense(6, activation="tanh", name="hidden2")(h)
    return functional(x, L.Dense(3, name="head")(h)), _x((5, 6))


def einsum_dense():
    x = keras.Input((4, 6))
    h = L.EinsumDense("abc,cd->abd", (4, 8), bias_axes="d", name="einsum")(x)
    h = L.Activation("relu")(h)
    h = L.EinsumDense("abc,cd->abd", (4, 5), name="einsum2")(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 4, 6))


def convs():
    """Conv1D, Conv2D and Conv3D (channels_last), a branch each."""
    inputs, branches, xs = [], [], []
    for rank, conv_cls, pool in (
        (1, L.Conv1D, L.GlobalAveragePooling1D),
        (2, L.Conv2D, L.GlobalAveragePooling2D),
        (3, L.Conv3D, L.GlobalMaxPooling3D),
    ):
        x = keras.Input((5,) * rank + (3,))
        h = conv_cls(6, 3, padding="same", name=f"conv{rank}d")(x)
        h = conv_cls(5, 3, activation="relu", name=f"conv{rank}d_b")(h)
        inputs.append(x)
        branches.append(pool()(h))
        xs.append(_x((2,) + (5,) * rank + (3,), seed=rank))
    return _head(branches, inputs, xs)


def conv_transposes():
    inputs, branches, xs = [], [], []
    for rank, conv_cls in (
        (1, L.Conv1DTranspose),
        (2, L.Conv2DTranspose),
        (3, L.Conv3DTranspose),
    ):
        x = keras.Input((3,) * rank + (3,))
        h = conv_cls(6, 2, strides=2, name=f"up{rank}d")(x)
        h = conv_cls(4, 3, padding="same", name=f"up{rank}d_b")(h)
        inputs.append(x)
        branches.append(L.Flatten()(h))
        xs.append(_x((2,) + (3,) * rank + (3,), seed=rank))
    return _head(branches, inputs, xs)


def depthwise_separable():
    """DepthwiseConv1D/2D (channels pass through) and SeparableConv1D/2D."""
    inputs, branches, xs = [], [], []
    for rank in (1, 2):
        conv_cls = {1: L.Conv1D, 2: L.Conv2D}[rank]
        x = keras.Input((5,) * rank + (2,))
        h = conv_cls(4, 1, name=f"expand{rank}d")(x)
        h = {1: L.DepthwiseConv1D, 2: L.DepthwiseConv2D}[rank](
            3, depth_multiplier=2, padding="same", name=f"depthwise{rank}d"
        )(h)
        h = conv_cls(3, 1, name=f"project{rank}d")(h)
        h = {1: L.SeparableConv1D, 2: L.SeparableConv2D}[rank](
            6, 3, depth_multiplier=2, padding="same", name=f"separable{rank}d"
        )(h)
        inputs.append(x)
        branches.append(L.Flatten()(h))
        xs.append(_x((2,) + (5,) * rank + (2,), seed=rank))
    return _head(branches, inputs, xs)


def channels_first():
    """Units on axis 1: channels_first convolutions (1-D, 2-D, 3-D, transposed,
    depthwise, separable), pooling and Flatten after them, and a batch norm on
    axis 1 after a Permute. (The transposes of other ranks differ from
    'up2d' only in their rank, and each costs seconds of XLA compiling here.)

    'conv1d' has 8 filters and an output 4 long: Keras adds its bias along
    the last axis when it has 4 channels, so half of it is 5 channels.
    """
    cf = dict(data_format="channels_first")
    a = keras.Input((3, 4))
    h = L.Conv1D(8, 3, padding="same", name="conv1d", **cf)(a)
    branch_a = L.GlobalAveragePooling1D(**cf)(h)
    b = keras.Input((3, 5, 5))
    h = L.Conv2D(6, 3, padding="same", name="conv2d", **cf)(b)
    h = L.DepthwiseConv2D(
        3, depth_multiplier=2, padding="same", name="depthwise", **cf
    )(h)
    h = L.SeparableConv2D(4, 3, padding="same", name="separable", **cf)(h)
    h = L.Conv2DTranspose(5, 2, name="up2d", **cf)(h)
    branch_b = L.Flatten(**cf)(L.MaxPooling2D(**cf)(h))
    c = keras.Input((3, 4, 4, 4))
    h = L.Conv3D(5, 3, padding="same", name="conv3d", **cf)(c)
    branch_c = L.GlobalAveragePooling3D(**cf)(h)
    d = keras.Input((6, 3))
    h = L.Permute((2, 1))(L.Dense(6, name="dense")(d))
    h = L.BatchNormalization(axis=1, name="bn")(h)
    h = L.ZeroPadding1D(1)(L.Permute((2, 1))(L.MaxPooling1D(2, **cf)(h)))
    branch_d = L.GlobalAveragePooling1D(**cf)(L.Permute((2, 1))(h))
    xs = [_x((2, 3, 4)), _x((2, 3, 5, 5), 2), _x((2, 3, 4, 4, 4), 3), _x((2, 6, 3), 4)]
    return _head([branch_a, branch_b, branch_c, branch_d], [a, b, c, d], xs)


def residual_bn():
    """A ResNet basic block: conv-BN-relu, conv-BN, add to the identity, relu."""
    x = keras.Input((6, 6, 3))
    stem = L.BatchNormalization(name="stem_bn")(
        L.Conv2D(8, 3, padding="same", name="stem")(x)
    )
    stem = L.ReLU()(stem)
    h = L.Conv2D(8, 3, padding="same", name="block_a")(stem)
    h = L.ReLU()(L.BatchNormalization(name="bn_a")(h))
    h = L.BatchNormalization(name="bn_b")(
        L.Conv2D(8, 3, padding="same", name="block_b")(h)
    )
    h = L.ReLU()(L.Add()([stem, h]))
    h = L.GlobalAveragePooling2D()(h)
    return functional(x, L.Dense(3, name="head")(h)), _x((2, 6, 6, 3))


def normalizations():
    """GroupNormalization (whole groups), PReLU, and LayerNormalization and
    UnitNormalization over the time axis (the units pass)."""
    x = keras.Input((5, 5, 2))
    h = L.Conv2D(8, 3, padding="same", name="conv")(x)
    h = L.GroupNormalization(groups=4, name="gn")(h)
    branch_a = L.Flatten()(L.ReLU()(h))
    t = keras.Input((4, 3))
    h = L.Dense(6, name="dense")(t)
    h = L.LayerNormalization(axis=1, name="ln")(h)
    h = L.UnitNormalization(axis=1, name="unit")(h)
    h = L.PReLU(name="prelu")(h)
    h = L.PReLU(shared_axes=[2], name="prelu_shared")(h)
    branch_b = L.GlobalMaxPooling1D()(h)
    return _head([branch_a, branch_b], [x, t], [_x((2, 5, 5, 2)), _x((2, 4, 3), 2)])


def merges():
    x = keras.Input((5,))
    a, b, c = (L.Dense(6, name=f"d{i}")(x) for i in range(3))
    outputs = [
        L.Add()([a, b, c]),
        L.Subtract()([a, b]),
        L.Multiply()([a, c]),
        L.Average()([b, c]),
        L.Maximum()([a, b]),
        L.Minimum()([b, c]),
    ]
    h = L.Concatenate()(outputs)
    return functional(x, L.Dense(2, name="head")(h)), _x((4, 5))


def concat_convs():
    """Inception-like: two branches concatenated, then a 1x1 conv."""
    x = keras.Input((6, 6, 2))
    a = L.Conv2D(4, 1, name="branch_a")(x)
    b = L.Conv2D(6, 3, padding="same", name="branch_b")(x)
    h = L.Concatenate(name="concat")([a, b, x])
    h = L.Conv2D(5, 1, name="mix")(h)
    h = L.GlobalAveragePooling2D()(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((2, 6, 6, 2))


def flatten_after_conv():
    x = keras.Input((6, 6, 2))
    h = L.Conv2D(5, 3, name="conv")(x)
    h = L.MaxPooling2D()(h)
    h = L.Flatten()(h)
    h = L.Dense(6, name="dense")(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((2, 6, 6, 2))


def moving_layers():
    """Padding, cropping, upsampling, pooling, Permute, Reshape, RepeatVector."""
    x = keras.Input((6, 6, 2))
    h = L.Conv2D(5, 3, padding="same", name="conv")(x)
    h = L.ZeroPadding2D(1)(h)
    h = L.Cropping2D(((1, 0), (0, 1)))(h)
    h = L.UpSampling2D(2, interpolation="bilinear")(h)
    h = L.AveragePooling2D(2, padding="same")(h)
    h = L.Dropout(0.3)(L.SpatialDropout2D(0.2)(L.LeakyReLU()(h)))
    h = L.Reshape((-1, 5))(h)
    h = L.Permute((2, 1))(h)
    h = L.Permute((2, 1))(h)
    h = L.GlobalMaxPooling1D()(h)
    h = L.RepeatVector(3)(h)
    h = L.Reshape((15,))(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((2, 6, 6, 2))


def embedding():
    x = keras.Input((5,), dtype="int32")
    h = L.Embedding(20, 6, name="embedding")(x)
    h = L.GlobalAveragePooling1D()(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 5), integers=20)


def attention():
    x = keras.Input((5, 6))
    h = L.Dense(8, name="embed")(x)
    h = L.MultiHeadAttention(4, 3, value_dim=2, name="mha")(h, h)
    h = L.GlobalAveragePooling1D()(L.ReLU()(h))
    return functional(x, L.Dense(2, name="head")(h)), _x((2, 5, 6))


def attention_residual():
    """Heads, and an output projection joined to its input by a residual add."""
    x = keras.Input((5, 6))
    q = L.Dense(8, name="embed")(x)
    kv = L.Dense(7, name="memory")(x)
    h = L.MultiHeadAttention(4, 3, name="mha")(q, kv, kv)
    h = L.Add()([q, h])
    h = L.Dense(6, activation="relu", name="ffn")(h)
    h = L.GlobalAveragePooling1D()(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((2, 5, 6))


def keras_attention():
    """Dot-product and additive attention: the values' channels pass; query and key stay."""
    x = keras.Input((5, 3))
    branches = []
    for cls in (L.Attention, L.AdditiveAttention):
        prefix = cls.__name__.lower()
        query = L.Dense(4, name=f"{prefix}_query")(x)
        key = L.Dense(4, name=f"{prefix}_key")(x)
        value = L.Dense(6, name=f"{prefix}_value")(x)
        h = cls(name=prefix)([query, value, key])
        branches.append(L.GlobalAveragePooling1D()(h))
    return _head(branches, x, _x((2, 5, 3)))


def recurrent():
    """SimpleRNN, LSTM, GRU and GRU(reset_after=False), two layers each."""
    x = keras.Input((4, 3))
    h = L.Dense(5, name="embed")(x)
    branches = []
    for name, cls, kwargs in (
        ("simple_rnn", L.SimpleRNN, {}),
        ("lstm", L.LSTM, {}),
        ("gru", L.GRU, {}),
        ("gru_before", L.GRU, {"reset_after": False}),
    ):
        seq = cls(6, return_sequences=True, name=name, **kwargs)(h)
        branches.append(cls(4, name=name + "_b", **kwargs)(seq))
    return _head(branches, x, _x((3, 4, 3)))


def recurrent_states():
    """Returned states, initial states, and an RNN over a cell."""
    x = keras.Input((4, 3))
    h = L.Dense(5, name="embed")(x)
    out, state_h, state_c = L.LSTM(6, return_state=True, name="encoder")(h)
    seq = L.LSTM(6, return_sequences=True, name="decoder")(
        h, initial_state=[state_h, state_c]
    )
    cell = L.RNN(L.GRUCell(5, reset_after=False), return_sequences=True, name="rnn")(x)
    branches = [out, L.GlobalAveragePooling1D()(seq), L.Flatten()(cell)]
    return _head(branches, x, _x((3, 4, 3)))


def bidirectional():
    x = keras.Input((4, 3))
    branches = []
    for merge_mode in ("concat", "sum"):
        h = L.Bidirectional(
            L.GRU(5, return_sequences=True),
            merge_mode=merge_mode,
            name=f"bi_{merge_mode}",
        )(x)
        branches.append(L.Bidirectional(L.LSTM(3), name=f"bi_{merge_mode}_b")(h))
    return _head(branches, x, _x((3, 4, 3)))


def time_distributed():
    x = keras.Input((3, 5, 5, 2))
    h = L.TimeDistributed(L.Conv2D(4, 3, name="conv"), name="td_conv")(x)
    h = L.TimeDistributed(L.Flatten(), name="td_flat")(h)
    h = L.TimeDistributed(L.Dense(6, name="dense"), name="td_dense")(h)
    h = L.LSTM(3, name="lstm")(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((2, 3, 5, 5, 2))


def nested():
    """A Sequential block and a functional block inside a functional model."""
    block = keras.Sequential(
        [
            keras.Input((6,)),
            L.Dense(8, activation="relu", name="inner_a"),
            L.Dense(6, name="inner_b"),
        ],
        name="block",
    )
    inner_in = keras.Input((6,))
    inner = keras.Model(inner_in, L.Dense(5, name="inner_c")(inner_in), name="inner")
    x = keras.Input((4,))
    h = L.Dense(6, name="embed")(x)
    h = L.Add()([h, block(h)])
    h = inner(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 4))


def sequential():
    model = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            L.Conv2D(6, 3, name="conv"),
            L.BatchNormalization(name="bn"),
            L.ReLU(),
            L.Flatten(),
            L.Dense(7, name="dense"),
            L.Dense(2, name="head"),
        ],
        name="seq",
    )
    return randomize(model), _x((2, 6, 6, 2))


def shared_layer():
    x = keras.Input((5,))
    shared = L.Dense(5, name="shared")
    h = shared(L.Dense(5, name="first")(x))
    h = shared(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 5))


# (name, factory) of every model with units that shrink must cut.
MODELS = {
    "mlp": mlp,
    "einsum_dense": einsum_dense,
    "convs": convs,
    "conv_transposes": conv_transposes,
    "depthwise_separable": depthwise_separable,
    "channels_first": channels_first,
    "residual_bn": residual_bn,
    "normalizations": normalizations,
    "merges": merges,
    "concat_convs": concat_convs,
    "flatten_after_conv": flatten_after_conv,
    "moving_layers": moving_layers,
    "embedding": embedding,
    "attention": attention,
    "attention_residual": attention_residual,
    "keras_attention": keras_attention,
    "recurrent": recurrent,
    "recurrent_states": recurrent_states,
    "bidirectional": bidirectional,
    "time_distributed": time_distributed,
    "nested": nested,
    "sequential": sequential,
    "shared_layer": shared_layer,
}


def assert_same_outputs(model, small, selection, x):
    """`small` (shrunk) computes what `model` under `selection`'s masks computes,
    output by output, to 1e-5 of each output's scale."""
    expected = masked_outputs(model, selection, x)
    got = run(small, x)
    for want, have in zip(keras.tree.flatten(expected), keras.tree.flatten(got)):
        assert want.shape == have.shape
        scale = float(np.max(np.abs(want))) or 1.0
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * scale)
