"""Output units of the built-in feed-forward Keras layers, from their class and config.

`TABLE` maps built-in Keras layer classes with trainable weights to a
function `layer -> OutputUnits`, or to one that raises the refusal with the
reason; `NESTED` maps the attention layers, whose units are their output
projection's, to a function `(layer, units_of) -> OutputUnits` that reads the
inner layer's declaration with `units_of`. `maskfit.units.keras_recurrent`
has the recurrent layers, their cells and wrappers (docs/output_mask.md has
the whole table). Classes are matched exactly: a subclass may compute
differently, so it needs its own declaration.
"""

import re

import keras

from maskfit import internals
from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, OutputUnits, refusal, units_along
from maskfit.units.keras_layers import LAYERS

__all__ = ["NESTED", "TABLE", "channel_axis", "present", "units_from_config"]

L = LAYERS


def present(layer, ownership):
    """`ownership` (by variable name) restricted to the layer's own variables."""
    names = {v.name for v in layer.weights}
    return {name: own for name, own in ownership.items() if name in names}


def _no_quantization(layer):
    mode = getattr(layer.dtype_policy, "quantization_mode", None)
    if mode is not None:
        raise refusal(
            layer,
            f"it is quantized ({mode}): its kernel is stored quantized and not"
            " trained by the optimizer",
        )


def _rank(layer):
    """The rank of the layer's (first) input, from the shape it was built for."""
    config = layer.get_build_config() or {}
    shape = config.get("input_shape")
    return len(shape) if probe_lib.is_shape(shape) else None


def _negative(axis, rank):
    return axis if rank is None else axis % rank - rank


def channel_axis(layer):
    """The axis of a conv-like layer's output that carries its channels."""
    return -1 if layer.data_format == "channels_last" else -(layer.rank + 1)


_bias_add_bug = []


def _adds_channels_first_bias_on_last_axis():
    """Whether `keras.ops.add(x, bias of shape (1, C, 1))` adds along x's last axis.

    Keras 3.15's TensorFlow backend does so when x's last dimension is C too
    (it takes the add for `tf.nn.bias_add` in NHWC), so the channels_first
    bias of a convolution whose output width equals its channels reaches
    every channel. Checked once, by running it.
    """
    if not _bias_add_bug:
        x = keras.ops.zeros((1, 2, 2))
        bias = keras.ops.reshape(keras.ops.convert_to_tensor([1.0, 2.0]), (1, 2, 1))
        added = keras.ops.convert_to_numpy(keras.ops.add(x, bias))
        _bias_add_bug.append(bool(added[0, 0, 1] == 2.0))
    return _bias_add_bug[0]


def _check_channels_first_bias(layer, units):
    """Refuses a channels_first conv whose bias Keras adds on the wrong axis.

    (The ConvLSTM cells add theirs with `+`, which broadcasts correctly.)
    """
    if layer.data_format != "channels_first" or not layer.use_bias:
        return
    shape = (layer.get_build_config() or {}).get("input_shape")
    if shape is None or not _adds_channels_first_bias_on_last_axis():
        return
    if layer.compute_output_shape(shape)[-1] == units:
        raise refusal(
            layer,
            f"with data_format='channels_first' and an output whose last dimension"
            f" equals its {units} channels, this Keras version adds the bias along"
            " the last axis (keras.ops.add takes it for an NHWC bias), so each bias"
            " entry reaches every channel",
            "Use an input size whose output width differs from the number of"
            " channels, use_bias=False, channels_last, or maskfit.ElementMask.",
        )


def _lora(ownership_of_b, names=("lora_kernel_a", "lora_kernel_b")):
    return {names[0]: SHARED, names[1]: ownership_of_b}


# ------------------------------------------------------------- dense, conv


def _dense(layer):
    _no_quantization(layer)
    owned = {
        "kernel": units_along(-1),
        "bias": units_along(0),
        **_lora(units_along(-1)),
    }
    return OutputUnits(layer.units, present(layer, owned), output_axis=-1)


def _embedding(layer):
    _no_quantization(layer)
    owned = {
        "embeddings": units_along(-1),
        **_lora(units_along(-1), ("lora_embeddings_a", "lora_embeddings_b")),
    }
    return OutputUnits(
        layer.output_dim,
        present(layer, owned),
        output_axis=-1,
        probe_inputs=_integer_inputs(layer, layer.input_dim),
    )


def _integer_inputs(layer, high):
    make = probe_lib.sample_inputs(layer, integers=high)
    return lambda rng: make(rng)[0]


def _einsum_dense(layer):
    _no_quantization(layer)
    match = re.match(
        r"^(\.\.\.)?(\w+)(\.\.\.)?,(\w+)->(\.\.\.)?(\w+)(\.\.\.)?$",
        layer.equation.replace(" ", ""),
    )
    kernel = next(v for v in layer.weights if v.name == "kernel")
    weight_spec, output_spec, right_elided = (
        match.group(4),
        match.group(6),
        match.group(7),
    )
    letter = None if right_elided else output_spec[-1]
    owned = {}
    kernel_axis = weight_spec.find(letter) if letter else -1
    if kernel_axis >= 0:
        units = kernel.shape[kernel_axis]
        owned["kernel"] = units_along(kernel_axis)
        last = kernel_axis == len(weight_spec) - 1
        owned.update(
            _lora(units_along(-1))
            if last
            else {"lora_kernel_a": units_along(kernel_axis), "lora_kernel_b": SHARED}
        )
    else:
        owned.update({"kernel": SHARED, **_lora(SHARED)})
        units = None
    bias_axes = layer.bias_axes or ""
    if letter and letter in bias_axes:
        first = min(output_spec.find(c) for c in bias_axes)
        owned["bias"] = units_along(output_spec[first:].index(letter))
    else:
        owned["bias"] = SHARED
    if units is None:
        shape = layer.compute_output_shape(layer.get_build_config()["input_shape"])
        units = shape[-1]
    return OutputUnits(units, present(layer, owned), output_axis=-1)


def _conv(layer):
    _no_quantization(layer)
    _check_channels_first_bias(layer, layer.filters)
    owned = {
        "kernel": units_along(-1),
        "bias": units_along(0),
        **_lora(units_along(-1)),
    }
    return OutputUnits(layer.filters, present(layer, owned), channel_axis(layer))


def _conv_transpose(layer):
    # kernel: kernel_size + (filters, input channels).
    _check_channels_first_bias(layer, layer.filters)
    owned = {"kernel": units_along(-2), "bias": units_along(0)}
    return OutputUnits(layer.filters, present(layer, owned), channel_axis(layer))


def _depthwise(layer):
    # kernel: kernel_size + (in, multiplier); output channel c * multiplier + m.
    kernel = next(v for v in layer.weights if v.name == "kernel")
    units = kernel.shape[-2] * kernel.shape[-1]
    _check_channels_first_bias(layer, units)
    owned = {"kernel": units_along((-2, -1)), "bias": units_along(0)}
    return OutputUnits(units, present(layer, owned), channel_axis(layer))


def _separable(layer):
    _check_channels_first_bias(layer, layer.filters)
    owned = {
        "depthwise_kernel": SHARED,
        "pointwise_kernel": units_along(-1),
        "bias": units_along(0),
    }
    return OutputUnits(layer.filters, present(layer, owned), channel_axis(layer))


# ----------------------------------------------------------- normalization


def _normalization(layer, names):
    """Scale/offset variables of the dims at `layer.axis`; units on the last."""
    rank = _rank(layer)
    axes = [layer.axis] if isinstance(layer.axis, int) else list(layer.axis)
    normalized = [a if rank is None else a % rank for a in axes]
    unit_axis = max(normalized)
    position = normalized.index(unit_axis)
    variable = next(v for v in layer.trainable_weights if v.name in names)
    units = variable.shape[position]
    owned = {name: units_along(position) for name in names}
    return OutputUnits(units, present(layer, owned), _negative(unit_axis, rank))


def _scale_offset(layer):
    return _normalization(layer, ("gamma", "beta"))


def _rms_norm(layer):
    return _normalization(layer, ("scale",))


def _prelu(layer):
    shape = layer.get_build_config()["input_shape"]
    units = shape[-1]
    alpha = next(v for v in layer.weights if v.name == "alpha")
    ownership = units_along(-1) if alpha.shape[-1] == units else SHARED
    return OutputUnits(units, {"alpha": ownership}, output_axis=-1)


# ---------------------------------------------------------------- attention


def _attention_output(layer, output_dense, units_of):
    """Only the output projection's entries belong to units; the rest mix them."""
    inner = units_of(output_dense)
    pairs = inner.pairs(output_dense)
    ids = {id(v) for v, _ in pairs}
    pairs += [(v, SHARED) for v in layer.trainable_weights if id(v) not in ids]
    # The second output, when asked for, is the attention scores: no units.
    return OutputUnits(inner.units, pairs, output_axis=(-1, None))


def _multi_head_attention(layer, units_of):
    return _attention_output(layer, layer.output_dense, units_of)


def _group_query_attention(layer, units_of):
    return _attention_output(layer, internals.attention_output_dense(layer), units_of)


def _scores_only(layer):
    """Attention layers whose only weights scale the scores: all shared."""
    shapes = layer.get_build_config()["input_shape"]
    units = shapes[1][-1]
    pairs = [(v, SHARED) for v in layer.trainable_weights]
    return OutputUnits(units, pairs, output_axis=(-1, None))


# ----------------------------------------------------------------- refused


def _refused(reason):
    def declare(layer):
        raise refusal(layer, reason)

    return declare


TABLE = {
    L.Dense: _dense,
    L.EinsumDense: _einsum_dense,
    L.Embedding: _embedding,
    L.Conv1D: _conv,
    L.Conv2D: _conv,
    L.Conv3D: _conv,
    L.Conv1DTranspose: _conv_transpose,
    L.Conv2DTranspose: _conv_transpose,
    L.Conv3DTranspose: _conv_transpose,
    L.DepthwiseConv1D: _depthwise,
    L.DepthwiseConv2D: _depthwise,
    L.SeparableConv1D: _separable,
    L.SeparableConv2D: _separable,
    L.BatchNormalization: _scale_offset,
    L.LayerNormalization: _scale_offset,
    L.GroupNormalization: _scale_offset,
    L.RMSNormalization: _rms_norm,
    L.PReLU: _prelu,
    L.Attention: _scores_only,
    L.AdditiveAttention: _scores_only,
    L.SpectralNormalization: _refused(
        "it rewrites its wrapped layer's kernel inside call() (kernel divided by"
        " its spectral norm) on every training step, outside the optimizer, so no"
        " entry can stay frozen"
    ),
    L.ReversibleEmbedding: _refused(
        "its output units depend on the call argument `reverse` (embedding"
        " dimensions forward, vocabulary entries in reverse), and the same weights"
        " serve both"
    ),
    L.STFTSpectrogram: _refused(
        "how its kernels' frequency bins reach the output depends on `mode`"
        " (`psd` adds neighbouring bins, `stft` concatenates real and imaginary"
        " parts), so a bin is not one output unit"
    ),
}


NESTED = {
    L.MultiHeadAttention: _multi_head_attention,
    L.GroupQueryAttention: _group_query_attention,
}


def units_from_config(layer):
    """The number of output units an unbuilt layer will have, if its config says."""
    cls = type(layer)
    if cls in (
        L.Dense,
        L.SimpleRNN,
        L.LSTM,
        L.GRU,
    ):
        return layer.units
    if cls is L.Embedding:
        return layer.output_dim
    if cls in (
        L.Conv1D,
        L.Conv2D,
        L.Conv3D,
        L.Conv1DTranspose,
        L.Conv2DTranspose,
        L.Conv3DTranspose,
        L.SeparableConv1D,
        L.SeparableConv2D,
    ):
        return layer.filters
    if cls is L.TimeDistributed:
        return units_from_config(layer.layer)
    if cls is L.Bidirectional:
        inner = units_from_config(layer.forward_layer)
        if inner is None:
            return None
        return 2 * inner if layer.merge_mode in ("concat", None) else inner
    return None
