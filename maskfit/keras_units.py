"""Output units of the built-in Keras layers, read from each layer's class and config.

`TABLE` maps every built-in Keras layer class with trainable weights to a
function `layer -> OutputUnits`, or to one that raises the refusal with the
reason (docs/output_mask.md has the table). Classes are matched exactly:
a subclass may compute differently, so it needs its own declaration.
"""

import re

import keras
import numpy as np

from maskfit import probe as probe_lib
from maskfit.output_units import SHARED
from maskfit.output_units import OutputUnits
from maskfit.output_units import output_units_of
from maskfit.output_units import refusal
from maskfit.output_units import units_along

__all__ = ["TABLE", "units_from_config"]

L = keras.layers


def _present(layer, ownership):
    """`ownership` (by variable name) restricted to the layer's own variables."""
    names = {v.name for v in layer.weights}
    return {name: own for name, own in ownership.items() if name in names}


def _no_quantization(layer):
    mode = getattr(layer.dtype_policy, "quantization_mode", None)
    if mode is not None:
        raise refusal(
            layer,
            f"it is quantized ({mode}): its kernel is stored quantized and not"
            " trained by the optimizer",
        )


def _rank(layer):
    """The rank of the layer's (first) input, from the shape it was built for."""
    config = layer.get_build_config() or {}
    shape = config.get("input_shape")
    return len(shape) if probe_lib._is_shape(shape) else None


def _negative(axis, rank):
    return axis if rank is None else axis % rank - rank


def _channel_axis(layer):
    return -1 if layer.data_format == "channels_last" else -(layer.rank + 1)


def _lora(ownership_of_b, names=("lora_kernel_a", "lora_kernel_b")):
    return {names[0]: SHARED, names[1]: ownership_of_b}


# ------------------------------------------------------------- dense, conv


def _dense(layer):
    _no_quantization(layer)
    owned = {
        "kernel": units_along(-1),
        "bias": units_along(0),
        **_lora(units_along(-1)),
    }
    return OutputUnits(layer.units, _present(layer, owned), output_axis=-1)


def _embedding(layer):
    _no_quantization(layer)
    owned = {
        "embeddings": units_along(-1),
        **_lora(units_along(-1), ("lora_embeddings_a", "lora_embeddings_b")),
    }
    return OutputUnits(
        layer.output_dim,
        _present(layer, owned),
        output_axis=-1,
        probe_inputs=_integer_inputs(layer, layer.input_dim),
    )


def _integer_inputs(layer, high):
    make = probe_lib.sample_inputs(layer, integers=high)
    return lambda rng: make(rng)[0]


def _einsum_dense(layer):
    _no_quantization(layer)
    match = re.match(
        r"^(\.\.\.)?(\w+)(\.\.\.)?,(\w+)->(\.\.\.)?(\w+)(\.\.\.)?$",
        layer.equation.replace(" ", ""),
    )
    kernel = next(v for v in layer.weights if v.name == "kernel")
    weight_spec, output_spec, right_elided = (
        match.group(4),
        match.group(6),
        match.group(7),
    )
    letter = None if right_elided else output_spec[-1]
    owned = {}
    kernel_axis = weight_spec.find(letter) if letter else -1
    if kernel_axis >= 0:
        units = kernel.shape[kernel_axis]
        owned["kernel"] = units_along(kernel_axis)
        last = kernel_axis == len(weight_spec) - 1
        owned.update(
            _lora(units_along(-1))
            if last
            else {"lora_kernel_a": units_along(kernel_axis), "lora_kernel_b": SHARED}
        )
    else:
        owned.update({"kernel": SHARED, **_lora(SHARED)})
        units = None
    bias_axes = layer.bias_axes or ""
    if letter and letter in bias_axes:
        first = min(output_spec.find(c) for c in bias_axes)
        owned["bias"] = units_along(output_spec[first:].index(letter))
    else:
        owned["bias"] = SHARED
    if units is None:
        shape = layer.compute_output_shape(layer.get_build_config()["input_shape"])
        units = shape[-1]
    return OutputUnits(units, _present(layer, owned), output_axis=-1)


def _conv(layer):
    _no_quantization(layer)
    owned = {
        "kernel": units_along(-1),
        "bias": units_along(0),
        **_lora(units_along(-1)),
    }
    return OutputUnits(layer.filters, _present(layer, owned), _channel_axis(layer))


def _conv_transpose(layer):
    # kernel: kernel_size + (filters, input channels).
    owned = {"kernel": units_along(-2), "bias": units_along(0)}
    return OutputUnits(layer.filters, _present(layer, owned), _channel_axis(layer))


def _depthwise(layer):
    # kernel: kernel_size + (in, multiplier); output channel c * multiplier + m.
    kernel = next(v for v in layer.weights if v.name == "kernel")
    units = kernel.shape[-2] * kernel.shape[-1]
    owned = {"kernel": units_along((-2, -1)), "bias": units_along(0)}
    return OutputUnits(units, _present(layer, owned), _channel_axis(layer))


def _separable(layer):
    owned = {
        "depthwise_kernel": SHARED,
        "pointwise_kernel": units_along(-1),
        "bias": units_along(0),
    }
    return OutputUnits(layer.filters, _present(layer, owned), _channel_axis(layer))


# ----------------------------------------------------------- normalization


def _normalization(layer, names):
    """Scale/offset variables of the dims at `layer.axis`; units on the last."""
    rank = _rank(layer)
    axes = [layer.axis] if isinstance(layer.axis, int) else list(layer.axis)
    normalized = [a if rank is None else a % rank for a in axes]
    unit_axis = max(normalized)
    position = normalized.index(unit_axis)
    variable = next(v for v in layer.trainable_weights if v.name in names)
    units = variable.shape[position]
    owned = {name: units_along(position) for name in names}
    return OutputUnits(units, _present(layer, owned), _negative(unit_axis, rank))


def _scale_offset(layer):
    return _normalization(layer, ("gamma", "beta"))


def _rms_norm(layer):
    return _normalization(layer, ("scale",))


def _prelu(layer):
    shape = layer.get_build_config()["input_shape"]
    units = shape[-1]
    alpha = next(v for v in layer.weights if v.name == "alpha")
    ownership = units_along(-1) if alpha.shape[-1] == units else SHARED
    return OutputUnits(units, {"alpha": ownership}, output_axis=-1)


# ---------------------------------------------------------------- attention


def _attention_output(layer, output_dense):
    """Only the output projection's entries belong to units; the rest mix them."""
    inner = output_units_of(output_dense)
    pairs = inner.pairs(output_dense)
    ids = {id(v) for v, _ in pairs}
    pairs += [(v, SHARED) for v in layer.trainable_weights if id(v) not in ids]
    # The second output, when asked for, is the attention scores: no units.
    return OutputUnits(inner.units, pairs, output_axis=(-1, None))


def _multi_head_attention(layer):
    return _attention_output(layer, layer.output_dense)


def _group_query_attention(layer):
    # GroupQueryAttention has no public accessor for its output projection
    # (MultiHeadAttention has `output_dense`); read the private attribute.
    return _attention_output(layer, layer._output_dense)


def _scores_only(layer):
    """Attention layers whose only weights scale the scores: all shared."""
    shapes = layer.get_build_config()["input_shape"]
    units = shapes[1][-1]
    pairs = [(v, SHARED) for v in layer.trainable_weights]
    return OutputUnits(units, pairs, output_axis=(-1, None))


# ---------------------------------------------------------------- recurrent


def _state_shapes(owner, cell):
    getter = getattr(owner, "get_initial_state", None)
    if getter is not None:
        try:
            return getter(batch_size=probe_lib._BATCH)
        except TypeError:
            return getter(probe_lib._BATCH)
    sizes = (
        cell.state_size
        if isinstance(cell.state_size, (list, tuple))
        else [cell.state_size]
    )
    return [np.zeros((probe_lib._BATCH, s)) for s in sizes]


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
        unit_axis = _channel_axis(cell) if hasattr(cell, "data_format") else -1
        segments = ((unit_axis, 0, units),) * outputs  # (h, [h]) or (h, [h, c])
        return OutputUnits(
            units, _present(cell, owned), segments, probes=[_cell_probe(cell, segments)]
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
    inner = output_units_of(last)
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
    inner = _gate_cell(4)(cell) if conv_lstm else output_units_of(cell)
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
    fwd, bwd = output_units_of(forward), output_units_of(backward)
    axis = fwd.outputs[0][0]
    merge = layer.merge_mode
    if merge in ("concat", None):
        if merge == "concat" and axis != -1:
            raise refusal(
                layer,
                "it concatenates the two directions along the last axis, which is"
                f" not their unit axis ({axis})",
            )
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
    inner = output_units_of(inner_layer)
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


# ----------------------------------------------------------------- refused


def _refused(reason):
    def declare(layer):
        raise refusal(layer, reason)

    return declare


TABLE = {
    L.Dense: _dense,
    L.EinsumDense: _einsum_dense,
    L.Embedding: _embedding,
    L.Conv1D: _conv,
    L.Conv2D: _conv,
    L.Conv3D: _conv,
    L.Conv1DTranspose: _conv_transpose,
    L.Conv2DTranspose: _conv_transpose,
    L.Conv3DTranspose: _conv_transpose,
    L.DepthwiseConv1D: _depthwise,
    L.DepthwiseConv2D: _depthwise,
    L.SeparableConv1D: _separable,
    L.SeparableConv2D: _separable,
    L.BatchNormalization: _scale_offset,
    L.LayerNormalization: _scale_offset,
    L.GroupNormalization: _scale_offset,
    L.RMSNormalization: _rms_norm,
    L.PReLU: _prelu,
    L.MultiHeadAttention: _multi_head_attention,
    L.GroupQueryAttention: _group_query_attention,
    L.Attention: _scores_only,
    L.AdditiveAttention: _scores_only,
    L.SimpleRNNCell: _gate_cell(1, outputs=2),
    L.LSTMCell: _gate_cell(4),
    L.GRUCell: _gru_cell,
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
    L.SpectralNormalization: _refused(
        "it rewrites its wrapped layer's kernel inside call() (kernel divided by"
        " its spectral norm) on every training step, outside the optimizer, so no"
        " entry can stay frozen"
    ),
    L.ReversibleEmbedding: _refused(
        "its output units depend on the call argument `reverse` (embedding"
        " dimensions forward, vocabulary entries in reverse), and the same weights"
        " serve both"
    ),
    L.STFTSpectrogram: _refused(
        "how its kernels' frequency bins reach the output depends on `mode`"
        " (`psd` adds neighbouring bins, `stft` concatenates real and imaginary"
        " parts), so a bin is not one output unit"
    ),
}


def units_from_config(layer):
    """The number of output units an unbuilt layer will have, if its config says."""
    cls = type(layer)
    if cls in (
        L.Dense,
        L.SimpleRNN,
        L.LSTM,
        L.GRU,
        L.SimpleRNNCell,
        L.LSTMCell,
        L.GRUCell,
    ):
        return layer.units
    if cls is L.Embedding:
        return layer.output_dim
    if cls in (
        L.Conv1D,
        L.Conv2D,
        L.Conv3D,
        L.Conv1DTranspose,
        L.Conv2DTranspose,
        L.Conv3DTranspose,
        L.SeparableConv1D,
        L.SeparableConv2D,
        L.ConvLSTM1D,
        L.ConvLSTM2D,
        L.ConvLSTM3D,
    ):
        return layer.filters
    if cls is L.TimeDistributed and type(layer.layer) in TABLE:
        return units_from_config(layer.layer)
    if cls is L.Bidirectional:
        inner = units_from_config(layer.forward_layer)
        if inner is None:
            return None
        return 2 * inner if layer.merge_mode in ("concat", None) else inner
    return None
