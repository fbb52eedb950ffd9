"""maskfit: declare which Keras parameters learn, and keep the rest exactly frozen."""

import keras as _keras

# The oldest Keras the suite passes on (BUILD.md, "Supported range"); older ones
# break maskfit silently (e.g. schedules never advance under mixed_float16).
_MIN_KERAS = (3, 10)
if tuple(int(part) for part in _keras.__version__.split(".")[:2]) < _MIN_KERAS:
    raise ImportError(
        f"maskfit needs Keras 3.10 or newer; this environment has Keras"
        f' {_keras.__version__}. Upgrade it with `pip install -U "keras>=3.10"`.'
    )

from maskfit import support as _support

# Nothing of maskfit runs on another backend (torch, numpy, openvino): fail
# here, naming the ones it runs on, rather than somewhere inside `fit`.
_support.check_backend()

# Module paths of earlier releases keep working for one release (`moved.MOVED`).
from maskfit import moved as _moved

_moved.install()

from maskfit import distribute, layers, oneshot, pruning, sparse, structured
from maskfit.apply import apply_gradients
from maskfit.backup import ExactBackupAndRestore
from maskfit.gradients import custom_gradient, reduce_to_shape
from maskfit.kinds import builtin as _builtin_kinds
from maskfit.memory import MaskMemory, MaskMemoryRow, mask_memory
from maskfit.model import MaskedModel, MaskedSequential
from maskfit.oneshot import OneShotReport, prune_oneshot
from maskfit.spec.declare import get_mask, set_mask
from maskfit.spec.layerwise import (
    LayerwiseBlock,
    LayerwisePlan,
    layerwise_decay,
    layerwise_depths,
)
from maskfit.spec.masks import ElementMask, OutputMask
from maskfit.spec.recipes import (
    bitfit,
    probe_then_finetune,
    sparse_finetune,
    train_embedding_rows,
    train_only,
)
from maskfit.spec.schedule import PiecewiseMask
from maskfit.step.stateless import StatelessMasks, stateless_apply, stateless_masks
from maskfit.summary import Summary, SummaryRow, summary
from maskfit.units.declaration import SHARED, OutputUnits, units_along
from maskfit.units.lookup import register_output_units

# What maskfit knows about each Keras layer class, one record per class,
# registered once for units, pruning and structured pruning to look up.
_builtin_kinds.install()
# The backend's own parts (on JAX: the masks' pytree registration).
_support.step_backend()

__all__ = [
    "apply_gradients",
    "bitfit",
    "custom_gradient",
    "distribute",
    "ElementMask",
    "ExactBackupAndRestore",
    "get_mask",
    "layers",
    "LayerwiseBlock",
    "layerwise_decay",
    "layerwise_depths",
    "LayerwisePlan",
    "mask_memory",
    "MaskedModel",
    "MaskedSequential",
    "MaskMemory",
    "MaskMemoryRow",
    "oneshot",
    "OneShotReport",
    "OutputMask",
    "OutputUnits",
    "PiecewiseMask",
    "probe_then_finetune",
    "prune_oneshot",
    "pruning",
    "reduce_to_shape",
    "register_output_units",
    "set_mask",
    "SHARED",
    "sparse",
    "sparse_finetune",
    "stateless_apply",
    "stateless_masks",
    "StatelessMasks",
    "structured",
    "summary",
    "Summary",
    "SummaryRow",
    "train_embedding_rows",
    "train_only",
    "units_along",
]

__version__ = "0.3.0"
