"""Layers maskfit refuses or passes over: preprocessing, foreign, Lambda, inputs, bases.

Preprocessing and augmentation layers have no trainable weights and are
meant for a model's inputs; STFTSpectrogram and MelSpectrogram hold a fixed
Fourier basis; the wrappers of other frameworks' modules hold variables
maskfit cannot look into; Lambda runs Python code maskfit cannot read.
`Layer` and `Wrapper` are the bases of custom layers: what a subclass
prunes or couples is its own `call`, so they have no pruning record.
"""

from maskfit.kinds import common
from maskfit.kinds.couplings.base import Refused
from maskfit.records import CONTAINER, NO_WEIGHTS, LayerKind, Unsupported
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["KINDS"]

_PREPROCESSING = "is a preprocessing or augmentation layer, meant for a model's inputs"
_FOREIGN = Unsupported(
    "its variables belong to a module maskfit cannot look into, so it cannot"
    " tell kernels from biases"
)
_FOREIGN_COUPLING = "wraps variables of another framework that maskfit cannot slice"
_FOURIER = "is a fixed Fourier transform of its input"

KINDS = {
    L.STFTSpectrogram: LayerKind(
        units=common.refused(
            "how its kernels' frequency bins reach the output depends on `mode`"
            " (`psd` adds neighbouring bins, `stft` concatenates real and"
            " imaginary parts), so a bin is not one output unit"
        ),
        prunable=NO_WEIGHTS,  # Not learned weights; TF-MOT has no such layer.
        coupling=Refused(_FOURIER),
    ),
    L.MelSpectrogram: LayerKind(prunable=NO_WEIGHTS, coupling=Refused(_FOURIER)),
    L.Normalization: LayerKind(
        prunable=NO_WEIGHTS,
        coupling=Refused(
            "keeps a mean and variance per channel in its config (adapted"
            " preprocessing)"
        ),
    ),
    L.Lambda: LayerKind(
        prunable=NO_WEIGHTS,
        coupling=Refused(
            "runs Python code (a Lambda) that maskfit cannot read, so which"
            " channels it mixes is unknown"
        ),
    ),
    L.InputLayer: LayerKind(prunable=NO_WEIGHTS, coupling=Refused("is a model input")),
    L.Pipeline: LayerKind(
        prunable=CONTAINER,
        coupling=Refused(
            "runs layers in a sequence maskfit does not walk (not coupled yet)"
        ),
    ),
    L.Layer: LayerKind(coupling=Refused("is the base Layer class")),
    L.Wrapper: LayerKind(coupling=Refused("is the base Wrapper class")),
}
for _cls in (L.TFSMLayer, L.JaxLayer, L.FlaxLayer, L.TorchModuleWrapper):
    KINDS[_cls] = LayerKind(prunable=_FOREIGN, coupling=Refused(_FOREIGN_COUPLING))
for _name in (
    "AugMix AutoContrast CategoryEncoding CenterCrop"
    " ContrastLimitedAdaptiveHistogramEqualization CutMix Discretization"
    " Equalization HashedCrossing Hashing IntegerLookup MaxNumBoundingBoxes MixUp"
    " RandAugment RandomBrightness RandomColorDegeneration RandomColorJitter"
    " RandomContrast RandomCrop RandomElasticTransform RandomErasing RandomFlip"
    " RandomGaussianBlur RandomGrayscale RandomHue RandomInvert RandomPerspective"
    " RandomPosterization RandomRotation RandomSaturation RandomSharpness"
    " RandomShear RandomTranslation RandomZoom Resizing Solarization"
    " StringLookup TextVectorization"
).split():
    KINDS[getattr(L, _name)] = LayerKind(
        prunable=NO_WEIGHTS, coupling=Refused(_PREPROCESSING)
    )
