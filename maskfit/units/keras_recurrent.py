"""Output units of the built-in recurrent Keras layers, their cells and wrappers.

For recurrent layers an entry belongs to unit `u` when it affects unit `u`
and no other unit in one cell step; the self-check probes the cell for one
step from random previous states. `Bidirectional` and `TimeDistributed`
take their inner layers' declarations, shifted and re-axed.
"""

import keras
import numpy as np

from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, OutputUnits, refusal, units_along
from maskfit.units.keras_tables import channel_axis, present

__all__ = ["NESTED", "TABLE"]

L = keras.layers


def _state_shapes(owner, cell):
    getter = getattr(owner, "get_initial_state", None)
    if getter is not None:
        try:
            return getter(batch_size=probe_lib.BATCH)
        except TypeError:
            return getter(probe_lib.BATCH)
    sizes = (
        cell.state_size
        if isinstance(cell.state_size, (list, tuple))
        else [cell.state_size]
    )
    return [np.zeros((probe_lib.BATCH, s)) for s in sizes]


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
        unit_axis = channel_axis(cell) if hasattr(cell, "data_format") else -1
        segments = ((unit_axis, 0, units),) * outputs  # (h, [h]) or (h, [h, c])
        return OutputUnits(
            units, present(cell, owned), segments, probes=[_cell_probe(cell, segments)]
        )

    return declare


def _gru_cell(cell):
    # With reset_after=False the reset gate r scales h_{t-1} *before* the
    # recurrent kernel of the candidate, so r's unit j reaches every unit:
    # its columns are shared. With reset_after=True, r multiplies unit j only.
    shared = () if cell.reset_after else (1,)
    return _gate_cell(3, shared, outputs=2)(cell)


def _stacked_cells(stacked, units_of):
    last = stacked.cells[-1]
    inner = units_of(last)
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


def _rnn(layer, units_of):
    cell = layer.cell
    # The cell of the ConvLSTM layers is not exported by keras.layers.
    conv_lstm = isinstance(layer, (L.ConvLSTM1D, L.ConvLSTM2D, L.ConvLSTM3D))
    inner = _gate_cell(4)(cell) if conv_lstm else units_of(cell)
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


def _bidirectional(layer, units_of):
    forward, backward = layer.forward_layer, layer.backward_layer
    fwd, bwd = units_of(forward), units_of(backward)
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


def _time_distributed(layer, units_of):
    inner_layer = layer.layer
    inner = units_of(inner_layer)
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


TABLE = {
    L.SimpleRNNCell: _gate_cell(1, outputs=2),
    L.LSTMCell: _gate_cell(4),
    L.GRUCell: _gru_cell,
}

# Layers whose declaration reads their cells' or inner layers' (`units_of`).
NESTED = {
    L.StackedRNNCells: _stacked_cells,
    L.RNN: _rnn,
    L.SimpleRNN: _rnn,
    L.LSTM: _rnn,
    L.GRU: _rnn,
    L.ConvLSTM1D: _rnn,
    L.ConvLSTM2D: _rnn,
    L.ConvLSTM3D: _rnn,
    L.Bidirectional: _bidirectional,
    L.TimeDistributed: _time_distributed,
}
