"""The recurrent layers, their cells and StackedRNNCells.

For recurrent layers an entry belongs to unit `u` when it affects unit `u`
and no other unit in one cell step; the self-check probes the cell for one
step from random previous states (`maskfit.kinds.wrappers` has
`Bidirectional` and `TimeDistributed`, which take these). Magnitude
pruning prunes the cells' kernels and recurrent kernels (TF-MOT), reached
through the layers that hold them. Structured pruning removes a unit's
columns in every gate block and its recurrent row (SimpleRNN, LSTM, GRU;
`GATES` says how many blocks each cell's kernels hold).
"""

import keras
import numpy as np

from maskfit import internals
from maskfit.kinds import common
from maskfit.kinds.couplings.base import Coupling, Refused
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.kinds.couplings.parts import (
    check_own,
    variable,
)
from maskfit.records import CONTAINER, LayerKind, Prunable
from maskfit.units import lookup
from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, OutputUnits, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["GATES", "KINDS", "Recurrent", "rnn_problem", "rnn_units"]


# The couplings of the recurrent layers and their wrappers.


def rnn_units(graph, layer, source, gates):
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


def rnn_problem(layer, gates):
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
        problem = rnn_problem(layer, self.gates)
        if problem:
            return graph.refuse(layer, call.inputs, problem, call.num_outputs)
        source = call.units[id(call.call.inputs[0])]
        space = rnn_units(graph, layer, source, self.gates)
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


# The gate blocks side by side in each cell's kernels, for structured pruning.
GATES = {L.SimpleRNNCell: 1, L.LSTMCell: 4, L.GRUCell: 3}


def _state_shapes(owner, cell):
    getter = getattr(owner, "get_initial_state", None)
    if getter is not None:
        try:
            return getter(batch_size=probe_lib.BATCH)
        except TypeError:
            return getter(probe_lib.BATCH)
    state_sizes = (
        cell.state_size
        if isinstance(cell.state_size, (list, tuple))
        else [cell.state_size]
    )
    return [np.zeros((probe_lib.BATCH, s)) for s in state_sizes]


def _cell_probe(cell, outputs, owner=None):
    """Probes one step of `cell` on random inputs and random previous states."""
    step = probe_lib.sample_inputs(cell)
    states = _state_shapes(owner or cell, cell)

    def inputs(rng):
        (x,), _ = step(rng)
        previous = [
            keras.ops.convert_to_tensor(rng.normal(size=tuple(s.shape)), x.dtype)
            for s in keras.tree.flatten(states)
        ]
        return (x, keras.tree.pack_sequence_as(states, previous)), {}

    return probe_lib.Probe(cell, inputs, outputs)


def _gate_cell(blocks, shared_blocks=(), outputs=3):
    """Recurrent cells whose kernels hold `blocks` gate blocks of units each."""

    def declare(cell):
        units = getattr(cell, "units", None) or cell.filters
        gates = units_along(-1, blocks=blocks, shared_blocks=shared_blocks)
        owned = {"kernel": gates, "recurrent_kernel": gates, "bias": gates}
        unit_axis = common.channel_axis(cell) if hasattr(cell, "data_format") else -1
        segments = ((unit_axis, 0, units),) * outputs  # (h, [h]) or (h, [h, c])
        return OutputUnits(
            units,
            common.present(cell, owned),
            segments,
            probes=[_cell_probe(cell, segments)],
        )

    return declare


def _gru_cell(cell):
    # With reset_after=False the reset gate r scales h_{t-1} *before* the
    # recurrent kernel of the candidate, so r's unit j reaches every unit:
    # its columns are shared. With reset_after=True, r multiplies unit j only.
    shared = () if cell.reset_after else (1,)
    return _gate_cell(3, shared, outputs=2)(cell)


def _stacked_cells(stacked):
    last = stacked.cells[-1]
    inner = lookup.output_units_of(last)
    pairs = inner.pairs(last)
    ids = {id(v) for v, _ in pairs}
    pairs += [(v, SHARED) for v in stacked.trainable_weights if id(v) not in ids]
    earlier = sum(
        len(c.state_size) if isinstance(c.state_size, (list, tuple)) else 1
        for c in stacked.cells[:-1]
    )
    segments = inner.outputs[:1] + (None,) * earlier + inner.outputs[1:]
    return OutputUnits(
        inner.units, pairs, segments, probes=[_cell_probe(stacked, segments)]
    )


def _rnn(layer):
    cell = layer.cell
    # The cell of the ConvLSTM layers is not exported by keras.layers.
    conv_lstm = isinstance(layer, (L.ConvLSTM1D, L.ConvLSTM2D, L.ConvLSTM3D))
    inner = _gate_cell(4)(cell) if conv_lstm else lookup.output_units_of(cell)
    segments = inner.outputs if layer.return_state else inner.outputs[:1]
    probe = _cell_probe(cell, inner.outputs, owner=layer)
    return OutputUnits(inner.units, inner.pairs(cell), segments, probes=[probe])


def _rnn_macs(layer, input_shapes, output_shapes):
    steps = input_shapes[0][1] or 1
    cell = layer.cell
    kernels = ("kernel", "recurrent_kernel")
    return steps * sum(common.size(common.weight(cell, n)) for n in kernels)


_CELL = "is a recurrent cell; its RNN layer is coupled instead"
_KERNELS = Prunable(("kernel", "recurrent_kernel"))
_CONV_LSTM = "is a convolutional LSTM (not coupled yet)"


def _layer(config_units=None, macs=_rnn_macs, coupling=None):
    return LayerKind(
        units=_rnn,
        prunable=CONTAINER,
        coupling=coupling or Recurrent(GATES),
        config_units=config_units,
        macs=macs,
    )


KINDS = {
    L.SimpleRNNCell: LayerKind(
        units=_gate_cell(1, outputs=2), prunable=_KERNELS, coupling=Refused(_CELL)
    ),
    L.LSTMCell: LayerKind(
        units=_gate_cell(4), prunable=_KERNELS, coupling=Refused(_CELL)
    ),
    L.GRUCell: LayerKind(units=_gru_cell, prunable=_KERNELS, coupling=Refused(_CELL)),
    # The cell of the ConvLSTM layers, which keras.layers does not export.
    internals.conv_lstm_cell_class(): LayerKind(prunable=_KERNELS),
    L.StackedRNNCells: LayerKind(
        units=_stacked_cells, prunable=CONTAINER, coupling=Refused(_CELL)
    ),
    L.RNN: _layer(),
    L.SimpleRNN: _layer(lambda layer: layer.units),
    L.LSTM: _layer(lambda layer: layer.units),
    L.GRU: _layer(lambda layer: layer.units),
    L.ConvLSTM1D: _layer(macs=None, coupling=Refused(_CONV_LSTM)),
    L.ConvLSTM2D: _layer(macs=None, coupling=Refused(_CONV_LSTM)),
    L.ConvLSTM3D: _layer(macs=None, coupling=Refused(_CONV_LSTM)),
}
