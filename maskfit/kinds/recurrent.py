"""The recurrent layers, their cells, StackedRNNCells, Bidirectional, TimeDistributed.

For recurrent layers an entry belongs to unit `u` when it affects unit `u`
and no other unit in one cell step; the self-check probes the cell for one
step from random previous states. `Bidirectional` and `TimeDistributed`
take their inner layers' declarations, shifted and re-axed. Magnitude
pruning prunes the cells' kernels and recurrent kernels (TF-MOT), reached
through the layers that hold them. Structured pruning removes a unit's
columns in every gate block and its recurrent row (SimpleRNN, LSTM, GRU;
`GATES` says how many blocks each cell's kernels hold).
"""

import keras
import numpy as np

from maskfit import internals
from maskfit.kinds import common
from maskfit.kinds.record import CONTAINER, LayerKind, Prunable
from maskfit.structured import couplings_sequence as couplings
from maskfit.structured import sizes
from maskfit.structured.couplings import Refused
from maskfit.units import lookup
from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, OutputUnits, refusal, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["GATES", "KINDS"]

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


def _shift(pairs, units, by):
    if units == 1:  # the whole inner layer belongs to its one unit
        return [(v, units_along((), offset=by)) for v, _ in pairs]
    return [(v, o if o is SHARED else o.shifted(by)) for v, o in pairs]


def _shift_segments(segments, by):
    return tuple(
        None if s is None else (s[0], s[1] + by, None if s[2] is None else s[2] + by)
        for s in segments
    )


def _bidirectional(layer):
    forward, backward = layer.forward_layer, layer.backward_layer
    fwd, bwd = lookup.output_units_of(forward), lookup.output_units_of(backward)
    axis = fwd.outputs[0][0]
    merge = layer.merge_mode
    if merge == "concat" and axis != -1:
        # Concatenated along the last axis, which is not the unit axis (a
        # channels_first ConvLSTM): unit u of each direction lands in unit u
        # of the merged output, as with "sum".
        merge = "side by side"
    if merge in ("concat", None):
        units, offset = fwd.units + bwd.units, fwd.units
    else:
        if fwd.units != bwd.units:
            raise refusal(layer, "its two directions have different numbers of units")
        units, offset = fwd.units, 0
    pairs = _shift(fwd.pairs(forward), fwd.units, 0) + _shift(
        bwd.pairs(backward), bwd.units, offset
    )
    fwd_states, bwd_states = fwd.outputs[1:], _shift_segments(bwd.outputs[1:], offset)
    if merge == "concat":
        main = ((axis, 0, units),)
    elif merge is None:
        main = (fwd.outputs[0],) + _shift_segments(bwd.outputs[:1], offset)
    else:
        main = ((axis, 0, units),)
    segments = main + ((fwd_states + bwd_states) if layer.return_state else ())
    probes = [
        p._replace(outputs=_shift_segments(p.outputs, shift))
        for declared, inner, shift in ((fwd, forward, 0), (bwd, backward, offset))
        for p in declared.probes_for(inner)
    ]
    return OutputUnits(units, pairs, segments, probes=probes)


def _time_distributed(layer):
    inner_layer = layer.layer
    inner = lookup.output_units_of(inner_layer)
    segments = tuple(
        None if s is None else (s[0] + 1 if s[0] >= 0 else s[0], *s[1:])
        for s in inner.outputs
    )
    return OutputUnits(
        inner.units,
        inner.pairs(inner_layer),
        segments,
        probes=inner.probes_for(inner_layer),
    )


def _bidirectional_units(layer):
    inner = lookup.units_from_config(layer.forward_layer)
    if inner is None:
        return None
    return 2 * inner if layer.merge_mode in ("concat", None) else inner


def _rnn_macs(layer, input_shapes, output_shapes):
    steps = input_shapes[0][1] or 1
    cell = layer.cell
    kernels = ("kernel", "recurrent_kernel")
    return steps * sum(sizes.size(sizes.weight(cell, n)) for n in kernels)


def _bidirectional_macs(layer, input_shapes, output_shapes):
    return sum(
        sizes.macs_of(inner, input_shapes, output_shapes)
        for inner in (layer.forward_layer, layer.backward_layer)
    )


def _time_distributed_macs(layer, input_shapes, output_shapes):
    steps = input_shapes[0][1] or 1
    inner_in = [tuple(s[:1]) + tuple(s[2:]) for s in input_shapes]
    inner_out = [tuple(s[:1]) + tuple(s[2:]) for s in output_shapes]
    return steps * sizes.macs_of(layer.layer, inner_in, inner_out)


_CELL = "is a recurrent cell; its RNN layer is coupled instead"
_KERNELS = Prunable(("kernel", "recurrent_kernel"))
_CONV_LSTM = "is a convolutional LSTM (not coupled yet)"


def _layer(config_units=None, macs=_rnn_macs, coupling=None):
    return LayerKind(
        units=_rnn,
        prunable=CONTAINER,
        coupling=coupling or couplings.Recurrent(GATES),
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
    L.Bidirectional: LayerKind(
        units=_bidirectional,
        prunable=CONTAINER,
        coupling=couplings.Bidirectional(GATES),
        config_units=_bidirectional_units,
        macs=_bidirectional_macs,
    ),
    L.TimeDistributed: LayerKind(
        units=_time_distributed,
        prunable=CONTAINER,
        coupling=couplings.TimeDistributed(),
        config_units=lambda layer: lookup.units_from_config(layer.layer),
        macs=_time_distributed_macs,
    ),
}
