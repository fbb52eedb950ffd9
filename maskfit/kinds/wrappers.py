"""The wrappers of Keras: Bidirectional and TimeDistributed.

They take their inner layers' records: output units shifted and re-axed
(Bidirectional lays its two directions side by side or joins them, by
`merge_mode`), couplings read through the inner layers' (a recurrent layer's
for Bidirectional, any layer's for TimeDistributed, on one time step), and
multiply-accumulates summed over the directions or the time steps. Magnitude
pruning reaches the weights through the inner layers.
"""

import keras
import numpy as np

from maskfit.kinds import common
from maskfit.kinds.couplings.base import Coupling
from maskfit.kinds.couplings.calls import Call, CallUnits, TensorUnits
from maskfit.kinds.couplings.lookup import coupling_of
from maskfit.kinds.recurrent import GATES, Recurrent, rnn_problem, rnn_units
from maskfit.records import CONTAINER, LayerKind
from maskfit.units import lookup
from maskfit.units.declaration import SHARED, OutputUnits, refusal, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["Bidirectional", "KINDS", "TimeDistributed"]


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
        problems = (rnn_problem(d, self.gates) for d in (forward, backward))
        problem = next((p for p in problems if p), None)
        if problem is None and call.call.arguments.get("initial_state") is not None:
            problem = "is called with initial states"
        if problem:
            return graph.refuse(layer, call.inputs, problem, call.num_outputs)
        source = call.inputs[0]
        fwd = rnn_units(graph, forward, source, self.gates).ids
        bwd = rnn_units(graph, backward, source, self.gates).ids
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
        step = Call(inner, {"inputs": step_in}, [step_in], [step_out], (step_in,), {})
        return coupling_of(inner).couple(CallUnits(step, units, [source]), graph)

    def shrink_config(self, layer, config, shrunk):
        serialized = dict(config["layer"])
        serialized["config"] = coupling_of(layer.layer).shrink_config(
            layer.layer, dict(serialized["config"]), shrunk
        )
        config["layer"] = serialized
        return config


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


def _bidirectional_macs(layer, input_shapes, output_shapes):
    return sum(
        common.macs_of(inner, input_shapes, output_shapes)
        for inner in (layer.forward_layer, layer.backward_layer)
    )


def _time_distributed_macs(layer, input_shapes, output_shapes):
    steps = input_shapes[0][1] or 1
    inner_in = [tuple(s[:1]) + tuple(s[2:]) for s in input_shapes]
    inner_out = [tuple(s[:1]) + tuple(s[2:]) for s in output_shapes]
    return steps * common.macs_of(layer.layer, inner_in, inner_out)


KINDS = {
    L.Bidirectional: LayerKind(
        units=_bidirectional,
        prunable=CONTAINER,
        coupling=Bidirectional(GATES),
        config_units=_bidirectional_units,
        macs=_bidirectional_macs,
    ),
    L.TimeDistributed: LayerKind(
        units=_time_distributed,
        prunable=CONTAINER,
        coupling=TimeDistributed(),
        config_units=lambda layer: lookup.units_from_config(layer.layer),
        macs=_time_distributed_macs,
    ),
}
