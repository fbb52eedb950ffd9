"""A layer call's arguments, written down so the derivation can call the layer the same way.

A block in a model's graph is often called with more than its input: an
attention mask, a position bias, relative embeddings, a second stream.
Tracing it with its first input alone fails (a missing argument) or traces
another computation. `describe` writes a call's arguments as plain data
(JSON, for the JAX worker process): the first tensor, the one that carries
the units, is marked as the input; every other tensor by its shape and
dtype; plain values (flags, numbers, strings, None) as they are.
`fill` turns that back into `(args, kwargs)` for a concrete input: the
other tensors made by `make` (zeros by default, masks all True: they
carry no units and are no weights); `call` calls a layer so, in inference
mode.

Example:

>>> import keras
>>> x, bias = keras.KerasTensor((None, 4, 8)), keras.KerasTensor((None, 4, 4))
>>> described = describe((x,), {"bias": bias, "causal": True})
>>> args, kwargs = fill(described, np.ones((2, 4, 8), "float32"))
>>> args[0].shape, kwargs["bias"].shape, kwargs["causal"]
((2, 4, 8), (2, 4, 4), True)
"""

import inspect

import keras
import numpy as np

__all__ = [
    "FIRST_ONLY",
    "call",
    "concrete",
    "describe",
    "fill",
    "first_input",
    "key",
    "zeros",
]

_INPUT, _TENSOR = "__maskfit_input__", "__maskfit_tensor__"
_BATCH, _FILL = 2, 5

# A call with its first input alone (the layer's call known by nothing else).
FIRST_ONLY = {"args": [{_INPUT: True}], "kwargs": {}}


def first_input(call):
    """The index in `call.inputs` of the tensor that carries the call's units.

    The first tensor of the call's arguments in the order of `layer.call`'s
    signature (`Call.arguments`), not in Keras's order, which sorts keyword
    arguments by name (`layer(inputs=x, decoder_padding_mask=m)` lists the
    mask first).
    """
    for value in call.arguments.values():
        for tensor in keras.tree.flatten(value):
            if isinstance(tensor, keras.KerasTensor):
                return next(i for i, t in enumerate(call.inputs) if t is tensor)
    return 0


def describe(args, kwargs, first=None):
    """`{"args": [...], "kwargs": {...}}` of a call, as plain data.

    Args:
      args, kwargs: the call's arguments as given (KerasTensors in them).
      first: the tensor that is the input (`first_input`); None: the first
        in Keras's order.

    Returns:
      The arguments with `first` marked as the input wherever it is
      passed, and each other KerasTensor as its shape and dtype.

    Raises:
      ValueError: naming an argument that is neither a tensor nor a plain
        value (it cannot be written down for the worker).
    """
    tensors = [
        t
        for t in keras.tree.flatten((args, kwargs))
        if isinstance(t, keras.KerasTensor)
    ]
    if not tensors:
        return FIRST_ONLY
    if first is not None:
        tensors = [first]

    def plain(value, where):
        if value is tensors[0]:  # the input, wherever it is passed
            return {_INPUT: True}
        if isinstance(value, keras.KerasTensor):
            return {_TENSOR: [list(value.shape), str(value.dtype)]}
        if isinstance(value, (list, tuple)):
            return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {str(k): plain(v, f"{where}[{k!r}]") for k, v in value.items()}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise ValueError(
            f"its call argument {where} is a {type(value).__name__}, neither a"
            " tensor nor a plain value, so the call cannot be repeated to trace it"
        )

    return {
        "args": [plain(a, f"#{i}") for i, a in enumerate(args)],
        "kwargs": {k: plain(v, f"'{k}'") for k, v in kwargs.items()},
    }


def zeros(shape, dtype):
    """An extra tensor argument: zeros, or all True for a boolean mask."""
    if dtype == "bool":
        return np.ones(shape, bool)
    return np.zeros(shape, dtype)


def concrete(shape):
    """`shape` with the batch at 2 and every other unknown dimension at 5.

    The shape every probe of a layer's computation runs at (the checks, the
    trace, the config search).
    """
    return tuple(
        _BATCH if i == 0 else (_FILL if d is None else d) for i, d in enumerate(shape)
    )


def fill(described, x, make=zeros):
    """`(args, kwargs)` of `described` with `x` as the input.

    Args:
      described: what `describe` gave (None: the input alone).
      x: the input (any array or tensor).
      make: `make(shape, dtype)` gives each other tensor, at a concrete
        shape (the batch 2, every other unknown dimension 5).
    """

    def real(value):
        if isinstance(value, dict) and _INPUT in value:
            return x
        if isinstance(value, dict) and _TENSOR in value:
            shape, dtype = value[_TENSOR]
            return make(concrete(shape), dtype)
        if isinstance(value, list):
            return [real(v) for v in value]
        if isinstance(value, dict):
            return {k: real(v) for k, v in value.items()}
        return value

    described = described or FIRST_ONLY
    return (
        tuple(real(a) for a in described["args"]),
        {k: real(v) for k, v in described["kwargs"].items()},
    )


def key(described):
    """A hashable form of `described`, for the signatures that memoize a layer's call."""
    return repr(described or FIRST_ONLY)


def call(layer, described, x, make=zeros):
    """`layer` called on `x` with the other arguments of `described` (`fill`),
    `training=False` where its `call` takes it."""
    args, kwargs = fill(described, x, make)
    if "training" in inspect.signature(layer.call).parameters:
        kwargs["training"] = False
    return layer(*args, **kwargs)
