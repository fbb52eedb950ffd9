"""Layers that `keras.applications` defines for its own models, without exporting them.

InceptionResNetV2 scales its residual branches with `CustomScaleLayer`
(`inputs[0] + inputs[1] * scale`: an element-wise merge, whose inputs'
channels are joined); ConvNeXt scales each channel of a block's output with
`LayerScale` (`x * gamma`: channels pass through, `gamma` and
`projection_dim` shrink with them). Neither has prunable weights.
"""

import numpy as np

from maskfit import internals
from maskfit.kinds.couplings.base import Coupling, UnitCoupling
from maskfit.kinds.reshaping import Merge
from maskfit.records import NO_WEIGHTS, LayerKind

__all__ = ["KINDS"]


class _LayerScale(Coupling):
    """A learned scale per channel whose count is `projection_dim` in its config."""

    def couple(self, call, graph):
        gamma = call.layer.gamma  # unnamed in Keras: "variable"
        declared = UnitCoupling(passes=True, per_channel={gamma.path: 0})
        made = declared.couple(call, graph)
        graph.note(call.layer, "ids", made[0])
        return made

    def shrink_config(self, layer, config, shrunk):
        units = shrunk.note(layer, "ids")
        if units is not None and units.ids is not None:
            config["projection_dim"] = int(np.sum(shrunk.kept(units.ids)))
        return config


_COUPLINGS = {
    "CustomScaleLayer": Merge(),
    "LayerScale": _LayerScale(),
}

KINDS = {
    cls: LayerKind(prunable=NO_WEIGHTS, coupling=_COUPLINGS[name])
    for name, cls in internals.application_layer_classes().items()
}
