"""A functional or Sequential Keras model's graph, as structured pruning reads it.

Keras 3 keeps the graph of a functional model in private members; the
accessors in `maskfit.internals.graphs` read them (what each is for, and
the Keras versions checked), and this module turns what they give into
`Call`s: each layer call with its arguments bound to the names of its
`call` signature.
"""

import inspect

import keras

from maskfit.internals import graphs
from maskfit.kinds.couplings.calls import Call

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

# What this module reads through `maskfit.internals.graphs`
# (`tests/test_internals.py` checks them with every other private member).
PRIVATE_MEMBERS = graphs.PRIVATE_MEMBERS
missing_members = graphs.missing_members
is_graph_model = graphs.is_graph_model
input_name = graphs.input_name


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
    calls = []
    for node in graphs.call_nodes(model):
        args, kwargs = graphs.node_arguments(node)
        arguments = _bind(node.operation, args, kwargs)
        inputs, outputs = list(node.input_tensors), list(node.outputs)
        calls.append(Call(node.operation, arguments, inputs, outputs, args, kwargs))
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
