"""What several families' records share: unit declarations and multiply-accumulates.

Declarations are functions `layer -> maskfit.OutputUnits` of a built layer
(`maskfit.units.declaration`); these helpers read what they need from the
layer's config and build config, and refuse what cannot be declared. The
`macs` of a record count one call's multiply-accumulates per example from the
layer's weights and the call's shapes (`maskfit.structured.size_report`).
"""

import numpy as np

from maskfit import records
from maskfit.internals import versions
from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, refusal

__all__ = [
    "channel_axis",
    "check_channels_first_bias",
    "count",
    "lora",
    "macs_of",
    "negative",
    "no_quantization",
    "outputs",
    "present",
    "rank",
    "refused",
    "size",
    "weight",
]


def present(layer, ownership):
    """`ownership` (by variable name) restricted to the layer's own variables."""
    names = {v.name for v in layer.weights}
    return {name: own for name, own in ownership.items() if name in names}


def no_quantization(layer):
    """Refuses a quantized layer: its kernel is not trained by the optimizer."""
    mode = getattr(layer.dtype_policy, "quantization_mode", None)
    if mode is not None:
        raise refusal(
            layer,
            f"it is quantized ({mode}): its kernel is stored quantized and not"
            " trained by the optimizer",
        )


def rank(layer):
    """The rank of the layer's (first) input, from the shape it was built for."""
    config = layer.get_build_config() or {}
    shape = config.get("input_shape")
    return len(shape) if probe_lib.is_shape(shape) else None


def negative(axis, rank):
    """`axis` counted from the end (as it is when `rank` is unknown)."""
    return axis if rank is None else axis % rank - rank


def channel_axis(layer):
    """The axis of a conv-like layer's output that carries its channels."""
    return -1 if layer.data_format == "channels_last" else -(layer.rank + 1)


def check_channels_first_bias(layer, units):
    """Refuses a channels_first conv whose bias Keras adds on the wrong axis.

    (The ConvLSTM cells add theirs with `+`, which broadcasts correctly.)
    """
    if layer.data_format != "channels_first" or not layer.use_bias:
        return
    shape = (layer.get_build_config() or {}).get("input_shape")
    if shape is None or not versions.adds_channels_first_bias_on_last_axis():
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


def lora(ownership_of_b, names=("lora_kernel_a", "lora_kernel_b")):
    """The LoRA factors of a layer: A mixes every unit, B's units as given."""
    return {names[0]: SHARED, names[1]: ownership_of_b}


def refused(reason):
    """A declaration that refuses every layer of its class, with `reason`."""

    def declare(layer):
        raise refusal(layer, reason)

    return declare


# What the records' multiply-accumulates (`macs`) share.


def count(shape):
    """Entries per example of a tensor of `shape` (its batch axis left out)."""
    return int(np.prod([1 if d is None else d for d in shape[1:]], dtype=np.int64))


def outputs(output_shapes):
    """Entries per example of a call's first output (0 without outputs)."""
    return count(output_shapes[0]) if output_shapes else 0


def weight(layer, name):
    """The variable of `layer` called `name`, or None."""
    return next((v for v in layer.weights if v.name == name), None)


def size(variable):
    """The number of entries of `variable` (0 for None)."""
    return 0 if variable is None else int(np.prod(variable.shape, dtype=np.int64))


def macs_of(layer, input_shapes, output_shapes):
    """Multiply-accumulates of one call of `layer`, per example (batch of 1).

    Counted for the layers with weight products (dense, einsum, convolutions
    and their transposes, depthwise and separable, recurrent, attention,
    wrappers: the `macs` of their records, `maskfit.kinds`); normalization,
    activations, pooling and merges count 0, as do embeddings (a lookup).
    """
    kind = records.builtin(type(layer))
    if kind is None or kind.macs is None:
        return 0
    return kind.macs(layer, input_shapes, output_shapes)
