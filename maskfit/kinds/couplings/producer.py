"""`Producer`: the coupling of a layer that reads input channels and makes units.

Dense, Embedding, the convolutions and their transposes make units: their
own weights' columns, checked against the layer's real gradients
(`maskfit.units.layout.layer_units`), and the input slices they read.
Grouped convolutions go by group. Both the dense and the convolution
families (`maskfit.kinds.dense`, `maskfit.kinds.conv`) name it.
"""

import numpy as np

from maskfit.internals import versions
from maskfit.kinds.couplings.base import Coupling
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.kinds.couplings.parts import (
    own_units,
    read_units,
    unsupported,
    variable,
)

__all__ = ["Producer", "avoid_bias_on_last_axis", "conv_axis"]


class Producer(Coupling):
    """A layer that reads input channels and makes units of its own.

    Args:
      reads: `{variable name: (axis, repeat)}`: position `p` along `axis`
        reads input channel `p // repeat`.
      own: `{variable name: (axis, blocks)}`, as for `own_units`.
      units_key: the config key of the number of units.
      channel_axis: `layer -> axis` of its input and output channels.
    """

    def __init__(self, reads, own, units_key, channel_axis=lambda layer: -1):
        self.reads = reads
        self.own = own
        self.units_key = units_key
        self.channel_axis = channel_axis

    def repeat(self, layer, repeat):
        return layer.depth_multiplier if repeat == "multiplier" else repeat

    def couple(self, call, graph):
        layer = call.layer
        problem = unsupported(layer)
        if problem:
            return graph.refuse(layer, call.inputs, problem, call.num_outputs)
        if getattr(layer, "groups", 1) != 1:
            return _grouped(call, graph)
        axis = self.channel_axis(layer)
        if not self.reads and call.inputs:
            graph.fix(call.inputs[0].ids, f"read by '{layer.name}' as indices")
        if self.reads:
            ids = read_units(call, graph, call.inputs[0], axis)
            for name, (var_axis, repeat) in self.reads.items():
                var = variable(layer, name)
                if var is not None and ids is not None:
                    graph.slice(
                        layer, var, var_axis, np.repeat(ids, self.repeat(layer, repeat))
                    )
        size = layer.get_config()[self.units_key]
        space = own_units(graph, layer, size, self.own)
        avoid_bias_on_last_axis(graph, call, space.ids)
        return [TensorUnits(axis, space.ids)]

    def shrink_config(self, layer, config, shrunk):
        passed = shrunk.note(layer, "groups")
        if passed is not None:  # one input channel per group: whole groups went
            kept = int(np.sum(shrunk.kept(passed)))
            config["groups"] = kept
            config[self.units_key] = kept * (layer.filters // layer.groups)
            return config
        config[self.units_key] = shrunk.count(layer)
        return config


def _grouped(call, graph):
    """A grouped convolution (`groups > 1`): channels go by group.

    Group `g` reads input channels `g * per_in ...` with kernel positions
    `0 .. per_in - 1` along axis -2, shared by all groups, and makes filters
    `g * per_out ...`. With one input channel per group (a depthwise
    convolution written as Conv2D(C, k, groups=C)), that channel and its
    group's filters go together, and `groups` shrinks. Otherwise the same
    kernel position goes from every group at once (the input channels
    `p`, `per_in + p`, ... are joined) and so does the same filter of
    every group: equal numbers per group, `groups` unchanged.
    """
    layer = call.layer
    axis = conv_axis(layer)
    groups = layer.groups
    kernel, bias = variable(layer, "kernel"), variable(layer, "bias")
    per_in, per_out = kernel.shape[-2], layer.filters // groups
    source = call.inputs[0]
    ids = read_units(call, graph, source, axis)
    if per_in == 1 and ids is not None and np.any(ids >= 0):
        repeated = np.repeat(ids, per_out)
        graph.slice(layer, kernel, -1, repeated)
        if bias is not None:
            graph.slice(layer, bias, 0, repeated, scored=False)
        if graph.ignores(layer):
            graph.fix(ids, f"layer '{layer.name}' is in ignored_layers")
        avoid_bias_on_last_axis(graph, call, repeated)
        graph.note(layer, "groups", ids)
        graph.say(
            layer,
            f"grouped convolution (groups={groups}) with one input channel per"
            f" group: a channel and its group's {per_out} filters go together",
        )
        return [TensorUnits(axis, repeated, source.reason)]
    why = f"read at the same kernel position by every group of '{layer.name}'"
    if ids is not None:
        blocks = ids.reshape(groups, per_in)
        for block in blocks[1:]:
            graph.join(blocks[0], block, f"{why}, with a channel that stays")
        graph.slice(layer, kernel, -2, blocks[0])
    space = own_units(graph, layer, layer.filters, {"kernel": (-1, 1), "bias": (0, 1)})
    own = space.ids.reshape(groups, per_out)
    for block in own[1:]:
        graph.join(
            own[0], block, f"made at the same position by every group of '{layer.name}'"
        )
    avoid_bias_on_last_axis(graph, call, space.ids)
    graph.say(
        layer,
        f"grouped convolution (groups={groups}): filters and input channels go"
        " in equal numbers from every group, at the same positions",
    )
    return [TensorUnits(axis, space.ids)]


def conv_axis(layer):
    """The channel axis of a convolution's input and output."""
    return -1 if layer.data_format == "channels_last" else -(layer.rank + 1)


def avoid_bias_on_last_axis(graph, call, ids):
    """Keeps a channels_first conv from as many channels as its output's last dimension.

    Keras's TensorFlow backend (3.15 and others: `maskfit.internals.versions`
    checks it by running it) adds such a layer's bias along the last axis when that axis
    is as long as the channels: a smaller model with that many channels
    would compute something else. Where the length is unknown, the units
    stay.
    """
    layer = call.layer
    if getattr(layer, "data_format", None) != "channels_first" or not layer.use_bias:
        return
    if not versions.adds_channels_first_bias_on_last_axis():
        return
    width = call.output_shape(0)[-1]
    reason = (
        f"'{layer.name}' is a channels_first convolution with a bias, which this"
        " Keras version adds along the last axis when that axis is as long as"
        " the channels"
    )
    if width is None:
        graph.fix(ids, reason + " (its output's last dimension is unknown)")
    elif width > 1:
        graph.avoid(layer, ids, width, reason + f" ({width})")
