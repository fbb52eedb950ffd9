"""Pooling, padding, cropping, upsampling, reshaping and merging layers.

None has weights. Structured pruning finds where a layer that moves
positions sends each channel by running it (`ChannelMap`); element-wise
merges join their inputs' channels position by position, Concatenate lays
them side by side, Dot mixes them (its units stay).
"""

import keras
import numpy as np

from maskfit.kinds.common import negative
from maskfit.kinds.couplings import channel_map
from maskfit.kinds.couplings.base import Coupling, Refused
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.records import NO_WEIGHTS, LayerKind
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["ChannelMap", "Concatenate", "KINDS", "Merge"]


# The couplings of the layers that move positions and merge tensors.


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
        out_shape = call.output_shape(0)
        width = out_shape[axis] if -len(out_shape) <= axis else None
        if width is None or any(
            _width(t.shape, axis) not in (1, width)
            for t, u in zip(tensors, inputs)
            if u.ids is not None
        ):
            return graph.refuse(
                layer,
                inputs,
                f"gives an output of shape {out_shape[1:]} whose axis {axis} is not"
                f" its inputs' channels (inputs {shapes})",
                call.num_outputs,
            )
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
        along = negative(layer.axis, rank)
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


_MOVING = (
    L.AveragePooling1D,
    L.AveragePooling2D,
    L.AveragePooling3D,
    L.MaxPooling1D,
    L.MaxPooling2D,
    L.MaxPooling3D,
    L.GlobalAveragePooling1D,
    L.GlobalAveragePooling2D,
    L.GlobalAveragePooling3D,
    L.GlobalMaxPooling1D,
    L.GlobalMaxPooling2D,
    L.GlobalMaxPooling3D,
    L.AdaptiveAveragePooling1D,
    L.AdaptiveAveragePooling2D,
    L.AdaptiveAveragePooling3D,
    L.AdaptiveMaxPooling1D,
    L.AdaptiveMaxPooling2D,
    L.AdaptiveMaxPooling3D,
    L.ZeroPadding1D,
    L.ZeroPadding2D,
    L.ZeroPadding3D,
    L.Cropping1D,
    L.Cropping2D,
    L.Cropping3D,
    L.UpSampling1D,
    L.UpSampling2D,
    L.UpSampling3D,
    L.Flatten,
    L.Permute,
    L.RepeatVector,
)
_MERGES = (L.Add, L.Subtract, L.Multiply, L.Average, L.Maximum, L.Minimum)

KINDS = {cls: LayerKind(prunable=NO_WEIGHTS, coupling=ChannelMap()) for cls in _MOVING}
KINDS.update({cls: LayerKind(prunable=NO_WEIGHTS, coupling=Merge()) for cls in _MERGES})
KINDS.update(
    {
        L.Reshape: LayerKind(prunable=NO_WEIGHTS, coupling=ChannelMap(reshapes=True)),
        L.Concatenate: LayerKind(prunable=NO_WEIGHTS, coupling=Concatenate()),
        L.Dot: LayerKind(
            prunable=NO_WEIGHTS,
            coupling=Refused(
                "takes dot products along an axis, mixing the channels on it"
            ),
        ),
    }
)
