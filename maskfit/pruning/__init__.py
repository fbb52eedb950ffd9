"""maskfit.pruning: magnitude pruning for Keras 3, with TF-MOT's names and semantics."""

from maskfit.pruning.magnitude import kept_count
from maskfit.pruning.magnitude import magnitude_mask
from maskfit.pruning.registry import PrunableLayer
from maskfit.pruning.registry import RegistryEntry
from maskfit.pruning.registry import classify
from maskfit.pruning.registry import prunable_layers
from maskfit.pruning.registry import prunable_weights
from maskfit.pruning.schedules import ConstantSparsity
from maskfit.pruning.schedules import PolynomialDecay
from maskfit.pruning.schedules import PruningSchedule
from maskfit.pruning.schedules import pruning_steps
from maskfit.pruning.schedules import schedule_table

__all__ = [
    "classify",
    "ConstantSparsity",
    "kept_count",
    "magnitude_mask",
    "PolynomialDecay",
    "prunable_layers",
    "prunable_weights",
    "pruning_steps",
    "PrunableLayer",
    "PruningSchedule",
    "RegistryEntry",
    "schedule_table",
]
