"""The `keras.ops` calls that a functional model records as operations.

`x + 3.0`, `keras.ops.hard_sigmoid(x)`, `x[:, 0]` on KerasTensors put an
operation (not a layer) in the graph. Element-wise ones pass units on (and
join the channels of the tensors they combine, broadcast or not);
reductions pass them on unless they reduce over them; those that move
positions are read by running them (`Moves`, below).
Any other operation keeps the units it reads, and `explain` names it.
Operations have no weights: their only record is this coupling, keyed by
the class name of Keras's operation.
"""

import keras
import numpy as np

from maskfit.kinds.common import negative
from maskfit.kinds.couplings import channel_map
from maskfit.kinds.couplings.base import Coupling
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.kinds.elementwise import Elementwise
from maskfit.kinds.normalization import Statistics
from maskfit.kinds.reshaping import Concatenate, Merge

__all__ = ["Guarded", "Moves", "OPS", "Reduce"]


# The couplings of keras.ops calls.


class Guarded(Coupling):
    """An operation's coupling that refuses, rather than fails, on a call it cannot read.

    Operations take arguments of every kind (`ops.where(x)` with one argument
    returns indices, not values): whatever stops a coupling keeps the units
    the operation reads, with the error as the reason.
    """

    def __init__(self, coupling):
        self.coupling = coupling

    def couple(self, call, graph):
        try:
            made = self.coupling.couple(call, graph)
        except Exception as error:  # noqa: BLE001 - an unreadable call keeps its units
            return graph.refuse(
                call.layer,
                call.inputs,
                f"could not be coupled ({type(error).__name__}: {error})",
                call.num_outputs,
            )
        for tensor, units in zip(call.call.outputs, made):
            shape = tuple(tensor.shape)
            if units.ids is not None and (
                not -len(shape) <= units.axis < 0 or shape[units.axis] != len(units.ids)
            ):
                return graph.refuse(
                    call.layer,
                    call.inputs,
                    f"gives an output of shape {shape} that does not carry its"
                    " input's channels",
                    call.num_outputs,
                )
        return made

    def shrink_config(self, layer, config, shrunk):
        return self.coupling.shrink_config(layer, config, shrunk)


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
            reduced = {negative(int(a), rank) for a in axes}
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


_ELEMENTWISE = (
    # Unary, and binary with broadcasting (numpy, nn, math, core).
    "Abs Absolute Add Arccos Arccosh Arcsin Arcsinh Arctan Arctan2 Arctanh Cast"
    " Cbrt Ceil Celu Clip Copy Cos Cosh Deg2rad Divide DivideNoNan Elu Equal Erf"
    " Erfc Erfinv Exp Exp2 Expm1 Fabs Floor FloorDivide Fmax Fmin Fmod Gelu"
    " Greater GreaterEqual HardShrink HardSigmoid HardSilu HardTanh Heaviside"
    " Hypot Isfinite Isinf Isnan LeakyRelu Less LessEqual Log Log10 Log1p Log2"
    " LogSigmoid Logaddexp Logaddexp2 LogicalAnd LogicalNot LogicalOr LogicalXor"
    " Maximum Minimum Mod Multiply NanToNum Negative NotEqual Power Rad2deg"
    " Reciprocal Relu Relu6 Round Rsqrt SaturateCast Selu Sigmoid Sign Silu Sin"
    " Sinh SoftShrink Softplus Softsign SparsePlus SparseSigmoid Sqrt Square"
    " Squareplus StopGradient Subtract Tan Tanh TanhShrink Threshold TrueDivide"
    " Trunc Where"
).split()
_REDUCTIONS = (
    "All Amax Amin Any Argmax Argmin Logsumexp Max Mean Min Prod Std Sum Var"
).split()
_MOVING = (
    "BroadcastTo ExpandDims Flip GetItem Moveaxis Pad Ravel Repeat Roll Slice"
    " Squeeze Swapaxes Tile Transpose"
).split()
_MIXING = "Glu LogSoftmax Softmax Sparsemax".split()

_OPS = {name: Merge() for name in _ELEMENTWISE}
_OPS.update({name: Reduce() for name in _REDUCTIONS})
_OPS.update({name: Moves() for name in _MOVING})
_OPS["Reshape"] = Moves(resizes="newshape")
_OPS["Concatenate"] = Concatenate()
_OPS["Normalize"] = Statistics()
_OPS.update(
    {
        name: Elementwise(
            lambda op: getattr(op, "axis", -1), "mixes them (a softmax over them)"
        )
        for name in _MIXING
    }
)
# A call the coupling cannot read (an unexpected argument) keeps its units.
OPS = {name: Guarded(coupling) for name, coupling in _OPS.items()}
