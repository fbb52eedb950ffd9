"""Private members of Keras that hold a functional or Sequential model's graph.

Part of `maskfit.internals`: structured pruning (`maskfit.structured.keras_graph`)
walks a model's layer calls, with the arguments each was called with, and
names a shrunk model's inputs as the original's. Keras 3 keeps all of that
in private members and has no public API for it (`model.layers` lists
layers, not calls; `keras.Model.get_config()` gives a serialized graph, not
the KerasTensors the layers were called with). Checked on Keras 3.10.0 with
TF 2.16.2 and on Keras 3.15.1 with TF 2.21.0.
"""

import keras

from maskfit.internals import models

# (where, member, what it is for).
PRIVATE_MEMBERS = (
    (
        "keras.src.models.functional.Functional",
        "_nodes_by_depth",
        "the call events (`Node`s) of a functional model, by depth, walked in"
        " Keras's own order (its `_run_through_graph` walks them so); no public"
        " API lists a model's layer calls.",
    ),
    (
        "keras.src.ops.node.Node",
        "arguments",
        "the arguments (`args`, `kwargs`: a `SymbolicArguments`) a layer was"
        " called with in the graph, KerasTensors in place of tensors; `Node`"
        " is exported only through keras.src.",
    ),
    (
        "keras.Sequential",
        "_functional",
        "the functional graph a built Sequential model runs (None before it is"
        " built); Sequential has no public accessor for it.",
    ),
    (
        "keras.KerasTensor",
        "_keras_history",
        "the operation (an `InputLayer` for a model input) that made a"
        " KerasTensor, for the input's name in a shrunk model.",
    ),
)


def sequential_graph(model):
    """The functional model a built `keras.Sequential` runs, or None before it is built."""
    return getattr(model, "_functional", None)


def is_graph_model(model):
    """Whether `model` is a functional model or a built `keras.Sequential`."""
    if isinstance(model, keras.Sequential):
        return sequential_graph(model) is not None
    return isinstance(model, models.functional_class())


def nodes_by_depth(model):
    """`{depth: [Node]}` of a functional model or a built `keras.Sequential`.

    Depth 0 holds the nodes that make the outputs; the deepest, the inputs.
    """
    functional = model
    if isinstance(model, keras.Sequential):
        functional = sequential_graph(model)
    return functional._nodes_by_depth


def calls(model):
    """Returns `(inputs, calls, outputs)` of a functional model or a built Sequential.

    `inputs` and `outputs` are the model's KerasTensors, flattened; `calls` is a
    list of `(operation, input_tensors, output_tensors)`, one per call of a
    layer or op (model inputs left out), each after the calls it reads
    (layer-wise depth walks them in this order).
    """
    found = [
        (node.operation, list(node.input_tensors), list(node.outputs))
        for node in layer_nodes(model)
    ]
    return keras.tree.flatten(model.inputs), found, keras.tree.flatten(model.outputs)


def layer_nodes(model):
    """The nodes of a model's layer and op calls, each after the nodes it reads.

    The nodes of `nodes_by_depth`, deepest first, without the model's inputs
    (input nodes, `InputLayer`s).
    """
    by_depth = nodes_by_depth(model)
    for depth in sorted(by_depth, reverse=True):
        for node in by_depth[depth]:
            if node.operation is None or node.is_input:
                continue
            if isinstance(node.operation, keras.layers.InputLayer):
                continue
            yield node


def node_arguments(node):
    """`(args, kwargs)` a graph node's layer was called with (KerasTensors in them)."""
    arguments = node.arguments
    return tuple(arguments.args), dict(arguments.kwargs)


def input_name(tensor):
    """The name of the `InputLayer` that made a model input `tensor`, or None."""
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
    if sequential_graph(model) is None:
        missing.append(PRIVATE_MEMBERS[2][:2])
    if input_name(inputs) is None:
        missing.append(PRIVATE_MEMBERS[3][:2])
    return missing
