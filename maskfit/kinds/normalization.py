"""The normalization layers, and SpectralNormalization (refused).

Their units are their per-channel scales and offsets, on the last
normalized axis; magnitude pruning prunes none of them (like biases).
Structured pruning removes a channel's parameters with the channel
(BatchNormalization; GroupNormalization whole groups), and keeps every
unit that a normalization over channels reads (LayerNormalization and
kin: removing one would change the others' statistics).
"""

from maskfit.kinds import common
from maskfit.kinds.record import NO_WEIGHTS, LayerKind, Unsupported
from maskfit.structured import couplings_keras, couplings_passing
from maskfit.structured.couplings import Refused
from maskfit.units.declaration import OutputUnits, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["KINDS"]


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


_STATISTICS = couplings_passing.Statistics()

KINDS = {
    L.BatchNormalization: LayerKind(
        units=_scale_offset,
        prunable=NO_WEIGHTS,
        coupling=couplings_keras.Normalization(
            ("gamma", "beta"), ("moving_mean", "moving_variance")
        ),
    ),
    L.GroupNormalization: LayerKind(
        units=_scale_offset,
        prunable=NO_WEIGHTS,
        coupling=couplings_keras.Normalization(("gamma", "beta"), grouped=True),
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
