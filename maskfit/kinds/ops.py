"""The `keras.ops` calls that a functional model records as operations.

`x + 3.0`, `keras.ops.hard_sigmoid(x)`, `x[:, 0]` on KerasTensors put an
operation (not a layer) in the graph. Element-wise ones pass units on (and
join the channels of the tensors they combine, broadcast or not);
reductions pass them on unless they reduce over them; those that move
positions are read by running them (`maskfit.structured.couplings_ops`).
Any other operation keeps the units it reads, and `explain` names it.
Operations have no weights: their only record is this coupling, keyed by
the class name of Keras's operation.
"""

from maskfit.structured import couplings_ops, couplings_passing

__all__ = ["OPS"]

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

OPS = {name: couplings_passing.Merge() for name in _ELEMENTWISE}
OPS.update({name: couplings_ops.Reduce() for name in _REDUCTIONS})
OPS.update({name: couplings_ops.Moves() for name in _MOVING})
OPS["Reshape"] = couplings_ops.Moves(resizes="newshape")
OPS["Concatenate"] = couplings_passing.Concatenate()
OPS["Normalize"] = couplings_passing.Statistics()
OPS.update(
    {
        name: couplings_passing.Elementwise(
            lambda op: getattr(op, "axis", -1), "mixes them (a softmax over them)"
        )
        for name in _MIXING
    }
)
