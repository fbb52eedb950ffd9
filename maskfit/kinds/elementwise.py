"""Activations, dropout, noise and other layers that keep channel `c` at position `c`.

None of them has prunable weights (PReLU's slopes are one per channel,
like a bias); PReLU's slopes are its units. Structured pruning passes
their channels through, except along an axis they mix (a softmax, a mask
over the last axis), whose units stay.
"""

import numpy as np

from maskfit.kinds.common import negative
from maskfit.kinds.couplings.base import Coupling
from maskfit.kinds.couplings.parts import (
    variable,
)
from maskfit.records import NO_WEIGHTS, LayerKind
from maskfit.units.declaration import SHARED, OutputUnits, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["activation_mixes", "Elementwise", "KINDS", "PReLU"]


# The couplings of the element-wise layers.


class PReLU(Coupling):
    """A slope per channel (or one shared along the unit axis)."""

    def couple(self, call, graph):
        layer, source = call.layer, call.inputs[0]
        alpha = variable(layer, "alpha")
        if source.ids is not None and alpha.shape[source.axis] == len(source.ids):
            graph.slice(layer, alpha, source.axis, source.ids)
        return [source]


class Elementwise(Coupling):
    """Channel `c` stays channel `c`, and no channel reaches another.

    Args:
      mixes: `layer -> axis or None`: an axis along which the layer mixes
        positions (softmax, a mask over the last axis); units on it stay.
      why: what the mixing is, for `explain`.
    """

    def __init__(self, mixes=lambda layer: None, why=""):
        self.mixes, self.why = mixes, why

    def couple(self, call, graph):
        source = call.inputs[0]
        axis = self.mixes(call.layer)
        if source.ids is not None and axis is not None:
            if negative(axis, len(call.input_shape())) == source.axis:
                graph.fix(source.ids, f"read by '{call.layer.name}', which {self.why}")
        return [source] * call.num_outputs


_MIXING = {"softmax", "log_softmax", "sparsemax", "glu"}


def activation_mixes(layer):
    """-1 for an activation that mixes the last axis (softmax, or unknown), else None."""
    name = getattr(layer.activation, "__name__", None)
    return -1 if name in _MIXING or name is None else None


def _prelu(layer):
    shape = layer.get_build_config()["input_shape"]
    units = shape[-1]
    alpha = next(v for v in layer.weights if v.name == "alpha")
    ownership = units_along(-1) if alpha.shape[-1] == units else SHARED
    return OutputUnits(units, {"alpha": ownership}, output_axis=-1)


def _passes(mixes=None, why=""):
    elementwise = Elementwise
    coupling = elementwise() if mixes is None else elementwise(mixes, why)
    return LayerKind(prunable=NO_WEIGHTS, coupling=coupling)


KINDS = {
    L.PReLU: LayerKind(units=_prelu, prunable=NO_WEIGHTS, coupling=PReLU()),
    L.Activation: _passes(
        activation_mixes,
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
