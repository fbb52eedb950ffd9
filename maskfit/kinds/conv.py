"""The convolutions, their transposes, depthwise and separable convolutions.

A convolution's units are its filters (the kernel's last axis; a transposed
convolution's second to last); a depthwise convolution's are each input
channel times its `depth_multiplier`, and it passes channels through.
Magnitude pruning prunes the kernels (the pointwise one of a separable
convolution; TF-MOT prunes no depthwise kernel). A channels_first
convolution whose output is as wide as its channels is refused or kept
whole where this Keras adds its bias on the wrong axis
(`maskfit.internals.versions`).
"""

import math

import numpy as np

from maskfit.kinds import common
from maskfit.kinds.couplings.base import Coupling
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.kinds.couplings.parts import (
    no_units,
    read_units,
    variable,
)
from maskfit.kinds.couplings.producer import (
    Producer,
    avoid_bias_on_last_axis,
    conv_axis,
)
from maskfit.records import NO_WEIGHTS, LayerKind, Prunable
from maskfit.units.declaration import SHARED, OutputUnits, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["Depthwise", "KINDS"]


# The coupling of depthwise convolutions (the others are `Producer`s).


class Depthwise(Coupling):
    """Each input channel and its `depth_multiplier` outputs go together."""

    def couple(self, call, graph):
        layer = call.layer
        axis = conv_axis(layer)
        ids = read_units(call, graph, call.inputs[0], axis)
        if ids is None:
            return [no_units(layer, "has an input of unknown channels")]
        repeated = np.repeat(ids, layer.depth_multiplier)
        avoid_bias_on_last_axis(graph, call, repeated)
        graph.slice(layer, variable(layer, "kernel"), -2, ids)
        if variable(layer, "bias") is not None:
            graph.slice(layer, variable(layer, "bias"), 0, repeated, scored=False)
        return [TensorUnits(axis, repeated, call.inputs[0].reason)]


def _conv(layer):
    common.no_quantization(layer)
    common.check_channels_first_bias(layer, layer.filters)
    owned = {
        "kernel": units_along(-1),
        "bias": units_along(0),
        **common.lora(units_along(-1)),
    }
    return OutputUnits(
        layer.filters, common.present(layer, owned), common.channel_axis(layer)
    )


def _conv_transpose(layer):
    # kernel: kernel_size + (filters, input channels).
    common.check_channels_first_bias(layer, layer.filters)
    owned = {"kernel": units_along(-2), "bias": units_along(0)}
    return OutputUnits(
        layer.filters, common.present(layer, owned), common.channel_axis(layer)
    )


def _depthwise(layer):
    # kernel: kernel_size + (in, multiplier); output channel c * multiplier + m.
    kernel = next(v for v in layer.weights if v.name == "kernel")
    units = kernel.shape[-2] * kernel.shape[-1]
    common.check_channels_first_bias(layer, units)
    owned = {"kernel": units_along((-2, -1)), "bias": units_along(0)}
    return OutputUnits(units, common.present(layer, owned), common.channel_axis(layer))


def _separable(layer):
    common.check_channels_first_bias(layer, layer.filters)
    owned = {
        "depthwise_kernel": SHARED,
        "pointwise_kernel": units_along(-1),
        "bias": units_along(0),
    }
    return OutputUnits(
        layer.filters, common.present(layer, owned), common.channel_axis(layer)
    )


def _conv_macs(layer, input_shapes, output_shapes):
    kernel = common.weight(layer, "kernel")
    return common.outputs(output_shapes) * common.size(kernel) // kernel.shape[-1]


def _transpose_macs(layer, input_shapes, output_shapes):
    kernel = common.weight(layer, "kernel")
    return common.count(input_shapes[0]) * common.size(kernel) // kernel.shape[-1]


def _depthwise_macs(layer, input_shapes, output_shapes):
    kernel = common.weight(layer, "kernel")
    return common.outputs(output_shapes) * math.prod(kernel.shape[:-2])


def _separable_macs(layer, input_shapes, output_shapes):
    depthwise = common.weight(layer, "depthwise_kernel")
    pointwise = common.weight(layer, "pointwise_kernel")
    positions = common.outputs(output_shapes) // pointwise.shape[-1]
    return positions * (common.size(depthwise) + common.size(pointwise))


def _filters(layer):
    return layer.filters


_CONV = LayerKind(
    units=_conv,
    prunable=Prunable(("kernel",)),
    coupling=Producer(
        {"kernel": (-2, 1)},
        {"kernel": (-1, 1), "bias": (0, 1)},
        "filters",
        conv_axis,
    ),
    config_units=_filters,
    macs=_conv_macs,
)
_TRANSPOSE = LayerKind(
    units=_conv_transpose,
    # Not in TF-MOT for 1D; its 2D and 3D siblings are.
    prunable=Prunable(("kernel",)),
    coupling=Producer(
        {"kernel": (-1, 1)},
        {"kernel": (-2, 1), "bias": (0, 1)},
        "filters",
        conv_axis,
    ),
    config_units=_filters,
    macs=_transpose_macs,
)
_DEPTHWISE = LayerKind(
    units=_depthwise,
    prunable=NO_WEIGHTS,  # TF-MOT: depthwise kernels are not pruned.
    coupling=Depthwise(),
    macs=_depthwise_macs,
)
_SEPARABLE = LayerKind(
    units=_separable,
    prunable=Prunable(("pointwise_kernel",)),
    coupling=Producer(
        {"depthwise_kernel": (-2, 1), "pointwise_kernel": (-2, "multiplier")},
        {"pointwise_kernel": (-1, 1), "bias": (0, 1)},
        "filters",
        conv_axis,
    ),
    config_units=_filters,
    macs=_separable_macs,
)

KINDS = {
    L.Conv1D: _CONV,
    L.Conv2D: _CONV,
    L.Conv3D: _CONV,
    L.Conv1DTranspose: _TRANSPOSE,
    L.Conv2DTranspose: _TRANSPOSE,
    L.Conv3DTranspose: _TRANSPOSE,
    L.DepthwiseConv1D: _DEPTHWISE,
    L.DepthwiseConv2D: _DEPTHWISE,
    L.SeparableConv1D: _SEPARABLE,
    L.SeparableConv2D: _SEPARABLE,
}
