"""Pooling, padding, cropping, upsampling, reshaping and merging layers.

None has weights. Structured pruning finds where a layer that moves
positions sends each channel by running it (`ChannelMap`); element-wise
merges join their inputs' channels position by position, Concatenate lays
them side by side, Dot mixes them (its units stay).
"""

from maskfit.kinds.record import NO_WEIGHTS, LayerKind
from maskfit.structured import couplings_passing as couplings
from maskfit.structured.couplings import Refused
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["KINDS"]

_MOVING = (
    L.AveragePooling1D,
    L.AveragePooling2D,
    L.AveragePooling3D,
    L.MaxPooling1D,
    L.MaxPooling2D,
    L.MaxPooling3D,
    L.GlobalAveragePooling1D,
    L.GlobalAveragePooling2D,
    L.GlobalAveragePooling3D,
    L.GlobalMaxPooling1D,
    L.GlobalMaxPooling2D,
    L.GlobalMaxPooling3D,
    L.AdaptiveAveragePooling1D,
    L.AdaptiveAveragePooling2D,
    L.AdaptiveAveragePooling3D,
    L.AdaptiveMaxPooling1D,
    L.AdaptiveMaxPooling2D,
    L.AdaptiveMaxPooling3D,
    L.ZeroPadding1D,
    L.ZeroPadding2D,
    L.ZeroPadding3D,
    L.Cropping1D,
    L.Cropping2D,
    L.Cropping3D,
    L.UpSampling1D,
    L.UpSampling2D,
    L.UpSampling3D,
    L.Flatten,
    L.Permute,
    L.RepeatVector,
)
_MERGES = (L.Add, L.Subtract, L.Multiply, L.Average, L.Maximum, L.Minimum)

KINDS = {
    cls: LayerKind(prunable=NO_WEIGHTS, coupling=couplings.ChannelMap())
    for cls in _MOVING
}
KINDS.update(
    {cls: LayerKind(prunable=NO_WEIGHTS, coupling=couplings.Merge()) for cls in _MERGES}
)
KINDS.update(
    {
        L.Reshape: LayerKind(
            prunable=NO_WEIGHTS, coupling=couplings.ChannelMap(reshapes=True)
        ),
        L.Concatenate: LayerKind(prunable=NO_WEIGHTS, coupling=couplings.Concatenate()),
        L.Dot: LayerKind(
            prunable=NO_WEIGHTS,
            coupling=Refused(
                "takes dot products along an axis, mixing the channels on it"
            ),
        ),
    }
)
