"""The normalization layers, and SpectralNormalization (refused).

Their units are their per-channel scales and offsets, on the last
normalized axis; magnitude pruning prunes none of them (like biases).
Structured pruning removes a channel's parameters with the channel
(BatchNormalization; GroupNormalization whole groups), and keeps every
unit that a normalization over channels reads (LayerNormalization and
kin: removing one would change the others' statistics).
"""

import numpy as np

from maskfit.kinds import common
from maskfit.kinds.common import negative
from maskfit.kinds.couplings.base import Coupling, Refused
from maskfit.kinds.couplings.parts import (
    variable,
)
from maskfit.records import NO_WEIGHTS, LayerKind, Unsupported
from maskfit.units.declaration import OutputUnits, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["KINDS", "Normalization", "Statistics"]


# The couplings of the normalizations.


class Normalization(Coupling):
    """BatchNormalization (per channel) and GroupNormalization (whole groups)."""

    def __init__(self, params, states=(), grouped=False):
        self.params, self.states, self.grouped = params, states, grouped

    def couple(self, call, graph):
        layer, source = call.layer, call.inputs[0]
        axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
        rank = len(call.input_shape())
        if len(axes) != 1:
            return graph.refuse(
                layer, call.inputs, f"normalizes along several axes {axes}"
            )
        axis = axes[0] % rank - rank
        if source.ids is None:
            return [source]
        if source.axis != axis:
            graph.fix(
                source.ids,
                f"normalized by '{layer.name}' along axis {axis}: its statistics"
                f" mix the units on axis {source.axis}",
            )
            return [source]
        ids = source.ids
        if self.grouped:
            size = len(ids) // layer.groups
            for group in range(layer.groups):
                members = ids[group * size : (group + 1) * size]
                graph.join(
                    members[:-1],
                    members[1:],
                    f"normalized in one group by '{layer.name}' with a channel that stays",
                )
            graph.note(layer, "ids", ids)
        for name in self.params:
            if variable(layer, name) is not None:
                graph.slice(layer, variable(layer, name), 0, ids, scored=name != "beta")
        for name in self.states:
            graph.slice(layer, variable(layer, name), 0, ids, state=True)
        graph.say(layer, "per-channel parameters go with their channel")
        return [source]

    def shrink_config(self, layer, config, shrunk):
        if self.grouped:
            ids = shrunk.note(layer, "ids")
            if ids is not None:
                kept = int(np.sum(shrunk.kept(ids)))
                config["groups"] = kept // (len(ids) // layer.groups)
        return config


class Statistics(Coupling):
    """LayerNormalization and kin: statistics over some axes.

    Removing a unit on a normalized axis would change the statistics of
    every other unit on it, so those units stay (a LayerNormalization over
    channels is a GroupNormalization with one group: only whole groups could
    go, and there is one). Units on other axes pass through.
    """

    def couple(self, call, graph):
        layer, source = call.layer, call.inputs[0]
        rank = len(call.input_shape())
        axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
        if source.ids is not None and source.axis in {negative(a, rank) for a in axes}:
            graph.fix(
                source.ids,
                f"normalized together by '{layer.name}' ({type(layer).__name__}):"
                " removing one would change the statistics of the others",
            )
        return [source]


def _normalization(layer, names):
    """Scale/offset variables of the dims at `layer.axis`; units on the last."""
    rank = common.rank(layer)
    axes = [layer.axis] if isinstance(layer.axis, int) else list(layer.axis)
    normalized = [a if rank is None else a % rank for a in axes]
    unit_axis = max(normalized)
    position = normalized.index(unit_axis)
    variable = next(v for v in layer.trainable_weights if v.name in names)
    units = variable.shape[position]
    owned = {name: units_along(position) for name in names}
    return OutputUnits(
        units, common.present(layer, owned), common.negative(unit_axis, rank)
    )


def _scale_offset(layer):
    return _normalization(layer, ("gamma", "beta"))


def _rms_norm(layer):
    return _normalization(layer, ("scale",))


_STATISTICS = Statistics()

KINDS = {
    L.BatchNormalization: LayerKind(
        units=_scale_offset,
        prunable=NO_WEIGHTS,
        coupling=Normalization(("gamma", "beta"), ("moving_mean", "moving_variance")),
    ),
    L.GroupNormalization: LayerKind(
        units=_scale_offset,
        prunable=NO_WEIGHTS,
        coupling=Normalization(("gamma", "beta"), grouped=True),
    ),
    L.LayerNormalization: LayerKind(
        units=_scale_offset, prunable=NO_WEIGHTS, coupling=_STATISTICS
    ),
    L.RMSNormalization: LayerKind(
        units=_rms_norm, prunable=NO_WEIGHTS, coupling=_STATISTICS
    ),
    L.UnitNormalization: LayerKind(prunable=NO_WEIGHTS, coupling=_STATISTICS),
    L.SpectralNormalization: LayerKind(
        units=common.refused(
            "it rewrites its wrapped layer's kernel inside call() (kernel divided"
            " by its spectral norm) on every training step, outside the"
            " optimizer, so no entry can stay frozen"
        ),
        prunable=Unsupported(
            "it rewrites the wrapped layer's kernel in every training call; prune"
            " the wrapped layer without SpectralNormalization"
        ),
        coupling=Refused(
            "divides the wrapped kernel by its spectral norm, which every unit changes"
        ),
    ),
}
