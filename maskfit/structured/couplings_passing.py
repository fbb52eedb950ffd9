"""Couplings of the Keras layers that pass units on: element-wise, reshaping, merging.

Element-wise layers (activations, dropout, noise) keep channel `c` at
position `c`. Layers that move positions around (pooling, padding,
cropping, upsampling, Flatten, Reshape, Permute, RepeatVector) are run once
on a tensor that holds `c + 1` in every position of channel `c`
(`channel_map`): what comes out says where each channel went, and a layer
that sends one channel to several axes, or mixes channels, keeps its units.
Element-wise merges join their inputs' channels position by position;
Concatenate lays them side by side. Layers that compute statistics or
products over the unit axis (softmax, LayerNormalization, Dot) keep every
unit they read. Which layer class takes which coupling is in its record
(`maskfit.kinds`).
"""

import keras
import numpy as np

from maskfit.structured import channel_map
from maskfit.structured.couplings import Coupling
from maskfit.structured.unit_nodes import TensorUnits

__all__ = [
    "ChannelMap",
    "Concatenate",
    "Elementwise",
    "Merge",
    "Statistics",
    "activation_mixes",
]


def _negative(axis, rank):
    return axis % rank - rank


class Elementwise(Coupling):
    """Channel `c` stays channel `c`, and no channel reaches another.

    Args:
      mixes: `layer -> axis or None`: an axis along which the layer mixes
        positions (softmax, a mask over the last axis); units on it stay.
      why: what the mixing is, for `explain`.
    """

    def __init__(self, mixes=lambda layer: None, why=""):
        self.mixes, self.why = mixes, why

    def couple(self, call, graph):
        source = call.inputs[0]
        axis = self.mixes(call.layer)
        if source.ids is not None and axis is not None:
            if _negative(axis, len(call.input_shape())) == source.axis:
                graph.fix(source.ids, f"read by '{call.layer.name}', which {self.why}")
        return [source] * call.num_outputs


_MIXING = {"softmax", "log_softmax", "sparsemax", "glu"}


def activation_mixes(layer):
    """-1 for an activation that mixes the last axis (softmax, or unknown), else None."""
    name = getattr(layer.activation, "__name__", None)
    return -1 if name in _MIXING or name is None else None


class Statistics(Coupling):
    """LayerNormalization and kin: statistics over some axes.

    Removing a unit on a normalized axis would change the statistics of
    every other unit on it, so those units stay (a LayerNormalization over
    channels is a GroupNormalization with one group: only whole groups could
    go, and there is one). Units on other axes pass through.
    """

    def couple(self, call, graph):
        layer, source = call.layer, call.inputs[0]
        rank = len(call.input_shape())
        axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
        if source.ids is not None and source.axis in {_negative(a, rank) for a in axes}:
            graph.fix(
                source.ids,
                f"normalized together by '{layer.name}' ({type(layer).__name__}):"
                " removing one would change the statistics of the others",
            )
        return [source]


class ChannelMap(Coupling):
    """Layers that move positions: where each channel goes, read by running it."""

    def __init__(self, reshapes=False):
        self.reshapes = reshapes

    def couple(self, call, graph):
        source = call.inputs[0]
        if source.ids is None:
            return [source]
        units, problem = channel_map.propagate(call.layer, call, source)
        if problem:
            graph.fix(source.ids, f"read by '{call.layer.name}', which {problem}")
            return [TensorUnits.none(f"output of '{call.layer.name}', which {problem}")]
        graph.note(call.layer, "ids", units)
        return [units]

    def shrink_config(self, layer, config, shrunk):
        units = shrunk.note(layer, "ids")
        if self.reshapes and units is not None and units.ids is not None:
            shape = list(config["target_shape"])
            shape[units.axis] = int(np.sum(shrunk.kept(units.ids)))
            config["target_shape"] = tuple(shape)
        return config


def _common_axis(inputs):
    axes = {u.axis for u in inputs if u.ids is not None}
    return axes.pop() if len(axes) == 1 else None


def _width(shape, axis):
    """The size of `shape` along negative `axis` (1 where the rank is too small)."""
    return shape[axis] if -len(shape) <= axis else 1


def _constants(call):
    """The shapes of the call's constant arguments that are arrays (not KerasTensors)."""
    shapes = []
    for value in keras.tree.flatten((call.call.args, call.call.kwargs)):
        if isinstance(value, keras.KerasTensor) or isinstance(value, (str, bytes)):
            continue
        shape = getattr(value, "shape", None)
        if shape is None:
            try:
                shape = np.shape(value)
            except (TypeError, ValueError):
                continue
        shapes.append(tuple(shape))
    return shapes


class Merge(Coupling):
    """Element-wise merges: channel `c` of every input makes channel `c`.

    Also the element-wise `keras.ops` calls (`x + 3.0`, `x * gate`). Inputs
    may broadcast along the other axes (a squeeze-and-excite gate of shape
    (1, 1, C) times a (H, W, C) tensor: the gate's channel `c` goes with
    the tensor's); an input of width 1 along the units' axis reaches every
    channel, so its unit stays; a constant argument that differs along the
    units' axis keeps them (a smaller model would need a cut constant).
    """

    def couple(self, call, graph):
        layer, inputs = call.layer, call.inputs
        tensors = call.call.inputs
        if not any(u.ids is not None for u in inputs):
            return [inputs[0]] * call.num_outputs
        axis = _common_axis(inputs)
        shapes = [tuple(t.shape[1:]) for t in tensors]
        if axis is None:
            return graph.refuse(
                layer,
                inputs,
                f"merges inputs of shapes {shapes} with units on different axes",
                call.num_outputs,
            )
        width = call.output_shape(0)[axis]
        full = [u for t, u in zip(tensors, inputs) if _width(t.shape, axis) == width]
        base = next((u for u in full if u.ids is not None), None)
        for tensor, units in zip(tensors, inputs):
            if _width(tensor.shape, axis) != width and units.ids is not None:
                graph.fix(
                    units.ids,
                    f"broadcast by '{layer.name}' over all {width} channels of"
                    " its other input",
                )
        if base is None:
            return [
                TensorUnits.none(f"output of '{layer.name}', broadcast over channels")
            ] * call.num_outputs
        for other in full:
            ids = other.ids if other.ids is not None else np.full(width, -1)
            graph.join(
                base.ids,
                ids,
                f"merged by '{layer.name}' with an input whose channels stay"
                f" ({other.reason})",
            )
        for shape in _constants(call):
            if _width(shape, axis) not in (1, None) or (
                len(shape) > len(call.output_shape(0))
            ):
                graph.fix(
                    base.ids,
                    f"combined by '{layer.name}' with a constant of shape {shape}"
                    " that differs along the units' axis (it could not be cut)",
                )
        return [TensorUnits(axis, base.ids, base.reason)] * call.num_outputs


class Concatenate(Coupling):
    """Channels side by side along the concatenation axis (or joined across it)."""

    def couple(self, call, graph):
        layer, inputs = call.layer, call.inputs
        rank = len(call.output_shape())
        along = _negative(layer.axis, rank)
        if all(u.ids is None for u in inputs):
            return [inputs[0]]
        axis = _common_axis(inputs)
        if axis == along:
            pieces = [
                u.ids if u.ids is not None else np.full(t.shape[along], -1, np.int64)
                for u, t in zip(inputs, call.call.inputs)
            ]
            return [TensorUnits(along, np.concatenate(pieces))]
        if axis is None:
            return graph.refuse(
                layer, inputs, "concatenates inputs with units on different axes"
            )
        return Merge().couple(call, graph)
