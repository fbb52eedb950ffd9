"""Couplings of `keras.ops` calls that a functional model records as operations.

Calling `keras.ops` on KerasTensors (`h + 3.0`, `x[:, 0]`,
`keras.ops.mean(x, axis=1)`, MobileNetV3's hard sigmoid) puts an operation
in the model's graph: not a layer, without weights. Element-wise operations
pass units on (`couplings_passing.Merge`, which joins tensors and checks
constants); reductions pass them on unless they reduce over them
(`Reduce`); operations that move positions (`x[:, 0]`, reshape, transpose)
are run once on channel numbers, as the layers that move positions are,
and once more on the numbers with one channel missing (`Moves`): an
operation that picks channels by position (`x[..., :4]`) would pick others
in a smaller model, and keeps them. An operation with no coupling is
refused: the units it reads stay, and `explain` names it. Which operation
takes which coupling is in `maskfit.kinds.ops`.
"""

import keras
import numpy as np

from maskfit.structured import channel_map
from maskfit.structured.couplings import Coupling
from maskfit.structured.unit_nodes import TensorUnits

__all__ = ["Moves", "Reduce"]


def _negative(axis, rank):
    return axis % rank - rank


class Reduce(Coupling):
    """A reduction (`mean`, `sum`, `max`, ...): units pass unless reduced over."""

    def couple(self, call, graph):
        op, source = call.layer, call.inputs[0]
        if source.ids is None:
            return [source]
        rank = len(call.input_shape())
        axis = getattr(op, "axis", None)
        if axis is None:
            reduced = set(range(-rank, 0))
        else:
            axes = axis if isinstance(axis, (list, tuple)) else [axis]
            reduced = {_negative(int(a), rank) for a in axes}
        if source.axis in reduced:
            return graph.refuse(
                op, [source], f"reduces over the units' axis {source.axis}"
            )
        shift = (
            0
            if getattr(op, "keepdims", False)
            else len([a for a in reduced if a > source.axis])
        )
        return [TensorUnits(source.axis + shift, source.ids, source.reason)]


def _substituted(call, tensor, values):
    """The call's arguments with `tensor` replaced by `values` (float32)."""
    value = keras.ops.convert_to_tensor(values, "float32")
    return keras.tree.map_structure(
        lambda x: value if x is tensor else x, (call.call.args, call.call.kwargs)
    )


class Moves(Coupling):
    """An operation that moves positions: read by running it on channel numbers.

    Args:
      resizes: the config key of an output shape that holds the channel
        count (`reshape`'s `newshape`), or None.
    """

    def __init__(self, resizes=None):
        self.resizes = resizes

    def resized(self, config, axis, count):
        if self.resizes is not None:
            shape = list(config[self.resizes])
            if shape[axis] != -1:
                shape[axis] = count
            config[self.resizes] = tuple(shape)
        return config

    def couple(self, call, graph):
        op, source = call.layer, call.inputs[0]
        tensor = call.call.inputs[0]
        for units in call.inputs[1:]:
            graph.fix(units.ids, f"read by '{op.name}' besides its first input")
        if source.ids is None:
            return [source]

        def run(values, operation=op):
            args, kwargs = _substituted(call, tensor, values)
            return operation(*args, **kwargs)

        units, problem = channel_map.propagate(op, call, source, run)
        if problem is None:
            problem = self._probe(op, call, source, units, run)
        if problem:
            graph.fix(source.ids, f"read by '{op.name}', which {problem}")
            return [TensorUnits.none(f"output of '{op.name}', which {problem}")]
        graph.note(op, "ids", units)
        return [units]

    def _probe(self, op, call, source, units, run):
        """Runs the operation without one channel (the first, a middle one): the
        others must land where they did."""
        width = len(source.ids)
        if width < 2:
            return None
        shape = call.input_shape(0)
        full = channel_map.channel_positions(op, shape, source.axis, width, run)
        for drop in (0, width // 2):
            problem = self._without(op, shape, source, units, run, full, drop)
            if problem:
                return problem
        return None

    def _without(self, op, shape, source, units, run, full, drop):
        """A problem if channel `drop` missing moves the others (None if not)."""
        width = len(source.ids)
        out_axis = units.axis % full.ndim
        others = tuple(a for a in range(full.ndim) if a != out_axis)
        per_position = full.max(axis=others) if others else full
        keep = per_position != drop + 1
        expected = np.compress(keep, full, axis=out_axis)
        numbers = np.delete(np.arange(1, width + 1, dtype=np.float64), drop)
        filled = [1] + [channel_map.FILL if d is None else int(d) for d in shape[1:]]
        filled[source.axis] = width - 1
        view = [1] * len(filled)
        view[source.axis] = width - 1
        values = np.broadcast_to(numbers.reshape(view), filled)
        config = self.resized(op.get_config(), units.axis, int(keep.sum()))
        try:
            smaller = type(op).from_config(config)
            out = run(values, smaller)
            got = np.rint(np.asarray(keras.ops.convert_to_numpy(out), np.float64)[0])
        except Exception as error:  # noqa: BLE001 - what cannot run keeps the units
            return (
                "could not be run with one channel fewer"
                f" ({type(error).__name__}: {error})"
            )
        if got.shape != expected.shape or np.any(got != expected):
            return (
                "picks channels by position, so in a smaller model it would pick others"
            )
        return None

    def shrink_config(self, layer, config, shrunk):
        units = shrunk.note(layer, "ids")
        if units is not None and units.ids is not None:
            count = int(np.sum(shrunk.kept(units.ids)))
            config = self.resized(config, units.axis, count)
        return config
