"""Activations, dropout, noise and other layers that keep channel `c` at position `c`.

None of them has prunable weights (PReLU's slopes are one per channel,
like a bias); PReLU's slopes are its units. Structured pruning passes
their channels through, except along an axis they mix (a softmax, a mask
over the last axis), whose units stay.
"""

import numpy as np

from maskfit.kinds.record import NO_WEIGHTS, LayerKind
from maskfit.structured import couplings_keras, couplings_passing
from maskfit.units.declaration import SHARED, OutputUnits, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["KINDS"]


def _prelu(layer):
    shape = layer.get_build_config()["input_shape"]
    units = shape[-1]
    alpha = next(v for v in layer.weights if v.name == "alpha")
    ownership = units_along(-1) if alpha.shape[-1] == units else SHARED
    return OutputUnits(units, {"alpha": ownership}, output_axis=-1)


def _passes(mixes=None, why=""):
    elementwise = couplings_passing.Elementwise
    coupling = elementwise() if mixes is None else elementwise(mixes, why)
    return LayerKind(prunable=NO_WEIGHTS, coupling=coupling)


KINDS = {
    L.PReLU: LayerKind(
        units=_prelu, prunable=NO_WEIGHTS, coupling=couplings_keras.PReLU()
    ),
    L.Activation: _passes(
        couplings_passing.activation_mixes,
        "mixes channels in its activation (or an unknown one)",
    ),
    L.Softmax: _passes(lambda layer: layer.axis, "takes a softmax over them"),
    L.Masking: _passes(
        lambda layer: -1, "masks a position when all its channels equal mask_value"
    ),
    L.Rescaling: _passes(
        lambda layer: (
            None if np.ndim(layer.scale) == np.ndim(layer.offset) == 0 else -1
        ),
        "scales channel by channel with constants it keeps for every channel",
    ),
}
for _cls in (
    L.ReLU,
    L.LeakyReLU,
    L.ELU,
    L.Dropout,
    L.AlphaDropout,
    L.GaussianDropout,
    L.GaussianNoise,
    L.SpatialDropout1D,
    L.SpatialDropout2D,
    L.SpatialDropout3D,
    L.ActivityRegularization,
    L.Identity,
):
    KINDS[_cls] = _passes()
