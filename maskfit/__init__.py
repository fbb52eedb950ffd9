"""maskfit: declare which Keras parameters learn, and keep the rest exactly frozen."""

from maskfit.declare import get_mask
from maskfit.declare import set_mask
from maskfit.model import MaskedModel
from maskfit.specs import ElementMask
from maskfit.specs import OutputMask

__all__ = [
    "ElementMask",
    "MaskedModel",
    "OutputMask",
    "get_mask",
    "set_mask",
]

__version__ = "0.1.0"
