"""A functional or Sequential Keras model's graph, as structured pruning reads it.

Keras 3 keeps the graph of a functional model in private members; this
module is the one place that reads them, and `PRIVATE_MEMBERS` lists them
(`tests/test_pruning_units_graph.py` fails with the member's name when a
Keras release removes one):

- `Functional._nodes_by_depth`: the graph's call events (`Node`s), by depth;
  Keras's own `_run_through_graph` walks them in the same order.
- `Node.arguments` (a `SymbolicArguments`) with `.args` and `.kwargs`: what
  each layer was called with, KerasTensors in place of tensors.
- `Sequential._functional`: the functional graph a built Sequential runs.
"""

import inspect
from typing import NamedTuple

import keras

from maskfit import internals

__all__ = [
    "PRIVATE_MEMBERS",
    "Call",
    "first_argument",
    "flatten",
    "graph_of",
    "input_name",
    "is_graph_model",
    "missing_members",
]

PRIVATE_MEMBERS = (
    (
        "keras.src.models.functional.Functional",
        "_nodes_by_depth",
        "the call events of a functional model, walked in Keras's own order",
    ),
    (
        "keras.src.ops.node.Node",
        "arguments",
        "the arguments (args, kwargs) a layer was called with in the graph",
    ),
    (
        "keras.Sequential",
        "_functional",
        "the functional graph a built Sequential model runs",
    ),
    (
        "keras.KerasTensor",
        "_keras_history",
        "the layer that made a model input, for its name in the shrunk model",
    ),
)


class Call(NamedTuple):
    """One call of a layer in a model's graph.

    Attributes:
      layer: the layer (or nested model) called.
      arguments: `{name: value}`, the call's arguments bound to the names of
        `layer.call`'s signature; tensors are KerasTensors.
      inputs: the KerasTensors among the arguments, in order.
      outputs: the KerasTensors it returned, flattened.
      args, kwargs: the call's arguments as given, to call another layer
        the same way.
    """

    layer: keras.layers.Layer
    arguments: dict
    inputs: list
    outputs: list
    args: tuple
    kwargs: dict


def is_graph_model(model):
    """Whether `model` is a functional or a built Sequential model."""
    if isinstance(model, keras.Sequential):
        return getattr(model, "_functional", None) is not None
    return isinstance(model, internals.functional_class())


def _functional(model):
    return model._functional if isinstance(model, keras.Sequential) else model


def _bind(layer, args, kwargs):
    """`{name: value}` of a call, by `layer.call`'s signature (positions if it fails)."""
    try:
        bound = inspect.signature(layer.call).bind(*args, **kwargs)
    except (TypeError, ValueError):
        named = {f"arg{i}": a for i, a in enumerate(args)}
        named.update(kwargs)
        return named
    arguments = dict(bound.arguments)
    for name, parameter in inspect.signature(layer.call).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD and name in arguments:
            arguments.update(arguments.pop(name))
    return arguments


def graph_of(model):
    """Returns `(inputs, calls, outputs)` of a functional or built Sequential model.

    `inputs` and `outputs` are the model's KerasTensors, flattened; `calls`
    lists every layer call (`Call`) in an order where each call comes after
    the calls that produce its inputs.

    Raises:
      ValueError: for a model whose graph Keras does not record (a subclassed
        model, an unbuilt Sequential).
    """
    if not is_graph_model(model):
        raise ValueError(
            f"Model '{model.name}' ({type(model).__name__}) has no layer graph to"
            " read: structured pruning needs a functional model or a built"
            " Sequential model (a subclassed model's call() is Python code that"
            " cannot be read). Build the model with keras.Input and the"
            " functional API, or give the Sequential model an Input first."
        )
    functional = _functional(model)
    calls = []
    for depth in sorted(functional._nodes_by_depth, reverse=True):
        for node in functional._nodes_by_depth[depth]:
            if node.operation is None or node.is_input:
                continue
            if isinstance(node.operation, keras.layers.InputLayer):
                continue
            arguments = node.arguments
            calls.append(
                Call(
                    node.operation,
                    _bind(node.operation, arguments.args, arguments.kwargs),
                    list(node.input_tensors),
                    list(node.outputs),
                    tuple(arguments.args),
                    dict(arguments.kwargs),
                )
            )
    inputs = keras.tree.flatten(model.inputs)
    outputs = keras.tree.flatten(model.outputs)
    return inputs, calls, outputs


def flatten(structure):
    """The KerasTensors in a nested structure of call arguments, in Keras's order."""
    return [
        x for x in keras.tree.flatten(structure) if isinstance(x, keras.KerasTensor)
    ]


def first_argument(call):
    """The first argument of a call (a nested model's inputs)."""
    return next(iter(call.arguments.values()))


def input_name(tensor):
    """The name of the InputLayer that made a model input `tensor`."""
    history = getattr(tensor, "_keras_history", None)
    operation = getattr(history, "operation", None)
    return getattr(operation, "name", None)


def missing_members():
    """`[(where, member)]` of `PRIVATE_MEMBERS` this Keras lacks."""
    inputs = keras.Input((2,))
    model = keras.Sequential([inputs, keras.layers.Dense(1)])
    functional = keras.Model(inputs, model(inputs))
    missing = []
    if not hasattr(functional, "_nodes_by_depth"):
        missing.append(PRIVATE_MEMBERS[0][:2])
    else:
        nodes = [n for ns in functional._nodes_by_depth.values() for n in ns]
        if not all(hasattr(n, "arguments") for n in nodes):
            missing.append(PRIVATE_MEMBERS[1][:2])
    if getattr(model, "_functional", None) is None:
        missing.append(PRIVATE_MEMBERS[2][:2])
    if input_name(inputs) is None:
        missing.append(PRIVATE_MEMBERS[3][:2])
    return missing
