"""Small models, one per coupled layer kind and structure, for structured pruning's tests.

Each factory returns `(model, inputs)`: a built functional (or Sequential)
model whose weights are random (so removed units matter), and a batch of
inputs for it. `masked_outputs` runs a model with the removed units' entries
set to 0, as training with `prune_units` leaves them; `shrink` must give
the same outputs.
"""

import keras
import numpy as np
import tensorflow as tf

from maskfit.pruning import unit_choice

L = keras.layers


def randomize(model, seed=0):
    """Random weights (positive variances), so every unit's entries matter."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if not ("float" in str(variable.dtype)):
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
    saved = [v.numpy() for v in model.weights]
    try:
        for each in plan.variables:
            mask = unit_choice.keep_mask(plan, keep, each.variable)
            each.variable.assign(tf.where(mask, each.variable, tf.zeros_like(each.variable)))
        return keras.tree.map_structure(np.asarray, model(x, training=False))
    finally:
        for variable, value in zip(model.weights, saved):
            variable.assign(value)


def _x(shape, seed=1, integers=None):
    rng = np.random.default_rng(seed)
    if integers is not None:
        return rng.integers(0, integers, size=shape).astype("int32")
    return rng.normal(size=shape).astype("float32")


def functional(inputs, outputs, seed=0):
    return randomize(keras.Model(inputs, outputs), seed)


# -------------------------------------------------------------- factories


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


def conv(rank, data_format="channels_last"):
    def make():
        spatial = (6,) * rank
        shape = spatial + (3,) if data_format == "channels_last" else (3,) + spatial
        conv_cls = {1: L.Conv1D, 2: L.Conv2D, 3: L.Conv3D}[rank]
        pool = {1: L.GlobalAveragePooling1D, 2: L.GlobalAveragePooling2D,
                3: L.GlobalAveragePooling3D}[rank]
        x = keras.Input(shape)
        h = conv_cls(6, 3, padding="same", data_format=data_format, name="conv")(x)
        h = conv_cls(5, 3, data_format=data_format, name="conv2", activation="relu")(h)
        h = pool(data_format=data_format)(h)
        return functional(x, L.Dense(2, name="head")(h)), _x((2,) + shape)

    return make


def conv_transpose(rank):
    def make():
        conv_cls = {1: L.Conv1DTranspose, 2: L.Conv2DTranspose, 3: L.Conv3DTranspose}[rank]
        x = keras.Input((4,) * rank + (3,))
        h = conv_cls(6, 2, strides=2, name="up")(x)
        h = conv_cls(4, 3, padding="same", name="up2")(h)
        h = L.Flatten()(h)
        return functional(x, L.Dense(2, name="head")(h)), _x((2,) + (4,) * rank + (3,))

    return make


def depthwise(rank):
    def make():
        conv_cls = {1: L.Conv1D, 2: L.Conv2D}[rank]
        depth_cls = {1: L.DepthwiseConv1D, 2: L.DepthwiseConv2D}[rank]
        x = keras.Input((6,) * rank + (2,))
        h = conv_cls(4, 1, name="expand")(x)
        h = depth_cls(3, depth_multiplier=2, padding="same", name="depthwise")(h)
        h = conv_cls(3, 1, name="project")(h)
        h = L.Flatten()(h)
        return functional(x, L.Dense(2, name="head")(h)), _x((2,) + (6,) * rank + (2,))

    return make


def separable(rank):
    def make():
        conv_cls = {1: L.Conv1D, 2: L.Conv2D}[rank]
        sep_cls = {1: L.SeparableConv1D, 2: L.SeparableConv2D}[rank]
        x = keras.Input((6,) * rank + (2,))
        h = conv_cls(4, 1, name="expand")(x)
        h = sep_cls(6, 3, depth_multiplier=2, padding="same", name="separable")(h)
        h = L.Flatten()(h)
        return functional(x, L.Dense(2, name="head")(h)), _x((2,) + (6,) * rank + (2,))

    return make


def residual_bn():
    """A ResNet basic block: conv-BN-relu, conv-BN, add to the identity, relu."""
    x = keras.Input((6, 6, 3))
    stem = L.BatchNormalization(name="stem_bn")(L.Conv2D(8, 3, padding="same", name="stem")(x))
    stem = L.ReLU()(stem)
    h = L.Conv2D(8, 3, padding="same", name="block_a")(stem)
    h = L.ReLU()(L.BatchNormalization(name="bn_a")(h))
    h = L.BatchNormalization(name="bn_b")(L.Conv2D(8, 3, padding="same", name="block_b")(h))
    h = L.ReLU()(L.Add()([stem, h]))
    h = L.GlobalAveragePooling2D()(h)
    return functional(x, L.Dense(3, name="head")(h)), _x((2, 6, 6, 3))


def group_norm():
    x = keras.Input((5, 5, 2))
    h = L.Conv2D(8, 3, padding="same", name="conv")(x)
    h = L.GroupNormalization(groups=4, name="gn")(h)
    h = L.Flatten()(L.ReLU()(h))
    return functional(x, L.Dense(2, name="head")(h)), _x((2, 5, 5, 2))


def layer_norm_over_time():
    """Normalizations over the time axis: the units on the last axis pass."""
    x = keras.Input((4, 3))
    h = L.Dense(6, name="dense")(x)
    h = L.LayerNormalization(axis=1, name="ln")(h)
    h = L.UnitNormalization(axis=1, name="unit")(h)
    h = L.Flatten()(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((2, 4, 3))


def prelu():
    x = keras.Input((5, 2))
    h = L.Dense(6, name="dense")(x)
    h = L.PReLU(name="prelu")(h)
    h = L.PReLU(shared_axes=[2], name="prelu_shared")(h)
    h = L.GlobalMaxPooling1D()(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 5, 2))


def merges():
    x = keras.Input((5,))
    a, b, c = (L.Dense(6, name=f"d{i}")(x) for i in range(3))
    outputs = [
        L.Add()([a, b, c]), L.Subtract()([a, b]), L.Multiply()([a, c]),
        L.Average()([b, c]), L.Maximum()([a, b]), L.Minimum()([b, c]),
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


def flatten_after_conv(data_format="channels_last"):
    def make():
        shape = (6, 6, 2) if data_format == "channels_last" else (2, 6, 6)
        x = keras.Input(shape)
        h = L.Conv2D(5, 3, data_format=data_format, name="conv")(x)
        h = L.MaxPooling2D(data_format=data_format)(h)
        h = L.Flatten(data_format=data_format)(h)
        h = L.Dense(6, name="dense")(h)
        return functional(x, L.Dense(2, name="head")(h)), _x((2,) + shape)

    return make


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


def channels_first():
    """Units on axis 1 (TensorFlow runs no channels_first convolution on a CPU)."""
    x = keras.Input((6, 3))
    h = L.Dense(6, name="dense")(x)
    h = L.Permute((2, 1))(h)
    h = L.BatchNormalization(axis=1, name="bn")(h)
    h = L.MaxPooling1D(2, data_format="channels_first")(h)
    h = L.ZeroPadding1D(1)(L.Permute((2, 1))(h))
    h = L.Permute((2, 1))(h)
    h = L.GlobalAveragePooling1D(data_format="channels_first")(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 6, 3))


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


def keras_attention(cls):
    """Dot-product attention: the values' channels pass; query and key stay."""

    def make():
        x = keras.Input((5, 3))
        query = L.Dense(4, name="query")(x)
        key = L.Dense(4, name="key")(x)
        value = L.Dense(6, name="value")(x)
        h = cls(name="attention")([query, value, key])
        h = L.GlobalAveragePooling1D()(h)
        return functional(x, L.Dense(2, name="head")(h)), _x((2, 5, 3))

    return make


def recurrent(cls, **kwargs):
    def make():
        x = keras.Input((4, 3))
        h = L.Dense(5, name="embed")(x)
        h = cls(6, return_sequences=True, name="rnn", **kwargs)(h)
        h = cls(4, name="rnn2", **kwargs)(h)
        return functional(x, L.Dense(2, name="head")(h)), _x((3, 4, 3))

    return make


def recurrent_states():
    x = keras.Input((4, 3))
    h = L.Dense(5, name="embed")(x)
    out, state_h, state_c = L.LSTM(6, return_state=True, name="encoder")(h)
    seq = L.LSTM(6, return_sequences=True, name="decoder")(h, initial_state=[state_h, state_c])
    h = L.Concatenate()([out, L.GlobalAveragePooling1D()(seq)])
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 4, 3))


def rnn_cell():
    x = keras.Input((4, 3))
    h = L.RNN(L.GRUCell(5, reset_after=False), return_sequences=True, name="rnn")(x)
    h = L.Flatten()(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 4, 3))


def bidirectional(merge_mode):
    def make():
        x = keras.Input((4, 3))
        h = L.Bidirectional(L.GRU(5, return_sequences=True), merge_mode=merge_mode, name="bi")(x)
        h = L.Bidirectional(L.LSTM(3), name="bi2")(h)
        return functional(x, L.Dense(2, name="head")(h)), _x((3, 4, 3))

    return make


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
        [keras.Input((6,)), L.Dense(8, activation="relu", name="inner_a"),
         L.Dense(6, name="inner_b")], name="block")
    inner_in = keras.Input((6,))
    inner = keras.Model(inner_in, L.Dense(5, name="inner_c")(inner_in), name="inner")
    x = keras.Input((4,))
    h = L.Dense(6, name="embed")(x)
    h = L.Add()([h, block(h)])
    h = inner(h)
    return functional(x, L.Dense(2, name="head")(h)), _x((3, 4))


def sequential():
    model = keras.Sequential(
        [keras.Input((6, 6, 2)), L.Conv2D(6, 3, name="conv"), L.BatchNormalization(name="bn"),
         L.ReLU(), L.Flatten(), L.Dense(7, name="dense"), L.Dense(2, name="head")],
        name="seq")
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
    "conv1d": conv(1),
    "conv2d": conv(2),
    "conv3d": conv(3),
    "conv1d_transpose": conv_transpose(1),
    "conv2d_transpose": conv_transpose(2),
    "conv3d_transpose": conv_transpose(3),
    "depthwise1d": depthwise(1),
    "depthwise2d": depthwise(2),
    "separable1d": separable(1),
    "separable2d": separable(2),
    "residual_bn": residual_bn,
    "group_norm": group_norm,
    "layer_norm_over_time": layer_norm_over_time,
    "prelu": prelu,
    "merges": merges,
    "concat_convs": concat_convs,
    "flatten_after_conv": flatten_after_conv(),
    "moving_layers": moving_layers,
    "channels_first": channels_first,
    "embedding": embedding,
    "attention": attention,
    "attention_residual": attention_residual,
    "dot_attention": keras_attention(L.Attention),
    "additive_attention": keras_attention(L.AdditiveAttention),
    "simple_rnn": recurrent(L.SimpleRNN),
    "lstm": recurrent(L.LSTM),
    "gru": recurrent(L.GRU),
    "gru_reset_before": recurrent(L.GRU, reset_after=False),
    "lstm_states": recurrent_states,
    "rnn_cell": rnn_cell,
    "bidirectional_concat": bidirectional("concat"),
    "bidirectional_sum": bidirectional("sum"),
    "time_distributed": time_distributed,
    "nested": nested,
    "sequential": sequential,
    "shared_layer": shared_layer,
}
