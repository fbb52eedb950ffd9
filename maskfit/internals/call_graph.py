"""The calls of a functional model's graph, as layer-wise depth reads them.

Part of `maskfit.internals`: Keras 3 keeps a functional model's graph in
private members, and `PRIVATE_MEMBERS` lists the ones read here. Checked on
Keras 3.10.0 with TF 2.16.2 and on Keras 3.15.1 with TF 2.21.0.
"""

import keras

# (where, member, what it is for).
PRIVATE_MEMBERS = (
    (
        "keras.src.models.functional.Functional",
        "_nodes_by_depth",
        "every call of a functional model's graph (layers and ops), in an order"
        " where each comes after those it reads: the depth of each layer in"
        " layerwise_decay; Keras has no public walk of the graph.",
    ),
)


def calls(model):
    """Returns `(inputs, calls, outputs)` of a functional model.

    `inputs` and `outputs` are the model's KerasTensors, flattened; `calls` is a
    list of `(operation, input_tensors, output_tensors)`, one per call of a
    layer or op (model inputs left out), each after the calls it reads.
    """
    found = []
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            if node.operation is None or node.is_input:
                continue
            if isinstance(node.operation, keras.layers.InputLayer):
                continue
            found.append((node.operation, list(node.input_tensors), list(node.outputs)))
    return keras.tree.flatten(model.inputs), found, keras.tree.flatten(model.outputs)


def missing_members():
    """`[(where, member)]` of `PRIVATE_MEMBERS` this Keras lacks."""
    inputs = keras.Input((2,))
    functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    if not hasattr(functional, "_nodes_by_depth"):
        return [PRIVATE_MEMBERS[0][:2]]
    return []
