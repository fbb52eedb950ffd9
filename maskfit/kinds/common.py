"""What several families' output-unit declarations share.

Declarations are functions `layer -> maskfit.OutputUnits` of a built layer
(`maskfit.units.declaration`); these helpers read what they need from the
layer's config and build config, and refuse what cannot be declared.
"""

from maskfit.internals import versions
from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, refusal

__all__ = [
    "channel_axis",
    "check_channels_first_bias",
    "lora",
    "negative",
    "no_quantization",
    "present",
    "rank",
    "refused",
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
