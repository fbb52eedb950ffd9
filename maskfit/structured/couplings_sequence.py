"""Couplings of the recurrent, wrapper and attention layers of Keras.

- SimpleRNN, LSTM, GRU (and `RNN` over one of their cells): unit `j` owns
  its column in every gate block of the kernel, the recurrent kernel and
  the bias, and the recurrent kernel's row `j` (it reads unit `j` back);
  their returned states carry the units too, and initial states join them.
- Bidirectional: each direction's units; "concat" lays them side by side,
  "sum", "ave" and "mul" join them.
- TimeDistributed: its layer's coupling, axes counted from the end.
- MultiHeadAttention: whole heads (their query, key, value, gate and
  output-projection slices) and the output projection's units.
- Attention, AdditiveAttention: the value's channels pass through when a
  separate key is given; query and key channels meet in dot products, so
  they stay.
"""

import keras
import numpy as np

from maskfit import internals
from maskfit.structured import couplings as couplings_lib
from maskfit.structured import keras_graph
from maskfit.structured.coupling_parts import check_own, no_units, read_units, variable
from maskfit.structured.couplings import Coupling
from maskfit.structured.unit_nodes import TensorUnits

__all__ = [
    "Bidirectional",
    "KerasAttention",
    "MultiHeadAttention",
    "Recurrent",
    "TimeDistributed",
]


def _rnn_units(graph, layer, source, gates):
    """Slices an RNN layer's cell for its units and input; returns its space.

    `source` is the units of the input sequence (read along its last axis);
    `gates` maps each coupled cell class to its kernels' gate blocks.
    """
    cell = layer.cell
    blocks = gates[type(cell)]
    space = graph.new_space(layer, "units", cell.units)
    ids = source.ids if source.ids is not None and source.axis == -1 else None
    if source.ids is not None and ids is None:
        graph.fix(
            source.ids, f"read by '{layer.name}' along the last axis, not {source.axis}"
        )
    gates = np.tile(space.ids, blocks)
    owned = {}
    for name in ("kernel", "recurrent_kernel", "bias"):
        var = variable(cell, name)
        if var is None:
            continue
        graph.slice(layer, var, -1, gates, scored=name != "bias")
        owned[id(var)] = (len(var.shape) - 1, gates)
    if ids is not None:
        graph.slice(layer, variable(cell, "kernel"), 0, ids)
    graph.slice(layer, variable(cell, "recurrent_kernel"), 0, space.ids)
    check_own(graph, layer, space, owned)
    return space


def _rnn_problem(layer, gates):
    if type(layer.cell) not in gates:
        return (
            f"runs a {type(layer.cell).__name__} cell; only SimpleRNN, LSTM and"
            " GRU cells are coupled"
        )
    if layer.stateful:
        return "is stateful: its states outlive a call"
    return None


class Recurrent(Coupling):
    """SimpleRNN, LSTM, GRU and RNN over one of their cells.

    Args:
      gates: `{cell class: number of gate blocks in its kernels}`, the cells
        it couples.
    """

    def __init__(self, gates):
        self.gates = gates

    def couple(self, call, graph):
        layer = call.layer
        problem = _rnn_problem(layer, self.gates)
        if problem:
            return graph.refuse(layer, call.inputs, problem, call.num_outputs)
        source = call.units[id(call.call.inputs[0])]
        space = _rnn_units(graph, layer, source, self.gates)
        states = call.call.arguments.get("initial_state")
        for tensor in keras.tree.flatten(states) if states is not None else ():
            if isinstance(tensor, keras.KerasTensor):
                units = call.units[id(tensor)]
                graph.join(
                    space.ids,
                    units.ids
                    if units.axis == -1 and units.ids is not None
                    else np.full(space.size, -1),
                    f"an initial state of '{layer.name}' whose channels stay",
                )
        return [TensorUnits(-1, space.ids)] * call.num_outputs

    def shrink_config(self, layer, config, shrunk):
        count = shrunk.count(layer)
        if "units" in config:
            config["units"] = count
        else:
            config["cell"]["config"]["units"] = count
        return config


class Bidirectional(Coupling):
    """Both directions' units: side by side ("concat") or joined ("sum", ...).

    Args:
      gates: as for `Recurrent`.
    """

    def __init__(self, gates):
        self.gates = gates

    def couple(self, call, graph):
        layer = call.layer
        forward, backward = layer.forward_layer, layer.backward_layer
        problems = (_rnn_problem(d, self.gates) for d in (forward, backward))
        problem = next((p for p in problems if p), None)
        if problem is None and call.call.arguments.get("initial_state") is not None:
            problem = "is called with initial states"
        if problem:
            return graph.refuse(layer, call.inputs, problem, call.num_outputs)
        source = call.inputs[0]
        fwd = _rnn_units(graph, forward, source, self.gates).ids
        bwd = _rnn_units(graph, backward, source, self.gates).ids
        merge = layer.merge_mode
        if merge == "concat":
            main = [TensorUnits(-1, np.concatenate([fwd, bwd]))]
        elif merge is None:
            main = [TensorUnits(-1, fwd), TensorUnits(-1, bwd)]
        else:
            graph.join(fwd, bwd)
            main = [TensorUnits(-1, fwd)]
        states = call.num_outputs - len(main)
        return (
            main
            + [TensorUnits(-1, fwd)] * (states // 2)
            + [TensorUnits(-1, bwd)] * (states // 2)
        )

    def shrink_config(self, layer, config, shrunk):
        directions = (
            ("layer", layer.forward_layer),
            ("backward_layer", layer.backward_layer),
        )
        for key, inner in directions:
            serialized = keras.saving.serialize_keras_object(inner)
            serialized["config"] = Recurrent(self.gates).shrink_config(
                inner, dict(serialized["config"]), shrunk
            )
            config[key] = serialized
        return config


class TimeDistributed(Coupling):
    """Its layer's coupling, on one time step (axes counted from the end)."""

    def couple(self, call, graph):
        layer = call.layer
        inner = layer.layer
        source = call.inputs[0]
        rank = len(call.input_shape())
        if source.ids is not None and source.axis == 1 - rank:
            graph.fix(source.ids, f"distributed over time by '{layer.name}'")
            source = TensorUnits.none(source.reason)
        step_in = keras.KerasTensor(call.input_shape()[:1] + call.input_shape()[2:])
        step_out = keras.KerasTensor(call.output_shape()[:1] + call.output_shape()[2:])
        units = dict(call.units)
        units[id(step_in)] = source
        step = keras_graph.Call(
            inner, {"inputs": step_in}, [step_in], [step_out], (step_in,), {}
        )
        return couplings_lib.coupling_of(inner).couple(
            couplings_lib.CallUnits(step, units, [source]), graph
        )

    def shrink_config(self, layer, config, shrunk):
        serialized = dict(config["layer"])
        serialized["config"] = couplings_lib.coupling_of(layer.layer).shrink_config(
            layer.layer, dict(serialized["config"]), shrunk
        )
        config["layer"] = serialized
        return config


def _sublayer(layer, name):
    return next(
        (s for s in internals.sublayers(layer, recursive=False) if s.name == name), None
    )


class MultiHeadAttention(Coupling):
    """Whole heads, and the units of the output projection."""

    def couple(self, call, graph):
        layer = call.layer
        heads = graph.new_space(layer, "heads", layer.num_heads, kind="heads")
        query, value = call.tensor("query"), call.tensor("value")
        key = value if call.tensor("key") is None else call.tensor("key")
        reading = {"query": query, "key": key, "value": value, "gate": query}
        for name, tensor in reading.items():
            dense = _sublayer(layer, name)
            if dense is None:
                continue
            ids = read_units(_Shape(call, tensor), graph, call.units[id(tensor)], -1)
            if ids is not None:
                graph.slice(layer, variable(dense, "kernel"), 0, ids)
            graph.slice(layer, variable(dense, "kernel"), 1, heads.ids)
            if variable(dense, "bias") is not None:
                graph.slice(layer, variable(dense, "bias"), 0, heads.ids, scored=False)
        output = _sublayer(layer, "attention_output")
        graph.slice(layer, variable(output, "kernel"), 0, heads.ids)
        size = variable(output, "kernel").shape[-1]
        own = graph.new_space(layer, "units", size)
        kernel = variable(output, "kernel")
        graph.slice(layer, kernel, -1, own.ids)
        owned = {id(kernel): (len(kernel.shape) - 1, own.ids)}
        bias = variable(output, "bias")
        if bias is not None:
            graph.slice(layer, bias, -1, own.ids, scored=False)
            owned[id(bias)] = (len(bias.shape) - 1, own.ids)
        check_own(graph, layer, own, owned)
        made = [TensorUnits(-1, own.ids)]
        if call.num_outputs > 1:
            scores = call.output_shape(1)
            if scores[1] == layer.num_heads:
                made.append(TensorUnits(1 - len(scores), heads.ids))
            else:
                graph.fix(
                    heads.ids, f"'{layer.name}' returns scores without a head axis"
                )
                made.append(no_units(layer, "returns scores"))
        return made

    def shrink_config(self, layer, config, shrunk):
        config["num_heads"] = shrunk.count(layer, "heads")
        shape = config.get("output_shape")
        count = shrunk.count(layer, "units")
        single = shape is None or isinstance(shape, int)
        config["output_shape"] = count if single else [*shape[:-1], count]
        return config


class _Shape:
    """A `CallUnits` stand-in whose first input is `tensor` (for `read_units`)."""

    def __init__(self, call, tensor):
        self.layer = call.layer
        self._shape = tuple(tensor.shape)

    def input_shape(self, i=0):
        return self._shape


class KerasAttention(Coupling):
    """Attention, AdditiveAttention: values pass through when a key is given."""

    def couple(self, call, graph):
        layer = call.layer
        units = [call.units[id(t)] for t in call.call.arguments.get("inputs")]
        query, value = units[0], units[1]
        key = units[2] if len(units) == 3 else value  # the value is the key
        for part in (query, key):
            graph.fix(
                part.ids, f"met in dot products by '{layer.name}' (query and key)"
            )
        if value.ids is not None and value.axis != -1:
            graph.fix(value.ids, f"read by '{layer.name}' along the last axis")
            value = no_units(layer, "reads its values along the last axis")
        scores = [no_units(layer, "returns attention scores")] * (call.num_outputs - 1)
        return [value] + scores
