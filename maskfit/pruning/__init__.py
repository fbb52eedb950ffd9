"""maskfit.pruning: magnitude pruning for Keras 3, with TF-MOT's names and semantics."""

from maskfit.pruning.callbacks import PruningSummaries
from maskfit.pruning.callbacks import UpdatePruningStep
from maskfit.pruning.magnitude import kept_count
from maskfit.pruning.magnitude import magnitude_mask
from maskfit.pruning.prune import PrunedModel
from maskfit.pruning.prune import prune_low_magnitude
from maskfit.pruning.prune import strip_pruning
from maskfit.pruning.registry import PrunableLayer
from maskfit.pruning.registry import RegistryEntry
from maskfit.pruning.registry import classify
from maskfit.pruning.registry import prunable_layers
from maskfit.pruning.registry import prunable_weights
from maskfit.pruning.rule import MagnitudePruning
from maskfit.pruning.schedules import ConstantSparsity
from maskfit.pruning.schedules import PolynomialDecay
from maskfit.pruning.schedules import PruningSchedule
from maskfit.pruning.schedules import pruning_steps
from maskfit.pruning.schedules import schedule_table

__all__ = [
    "classify",
    "ConstantSparsity",
    "kept_count",
    "MagnitudePruning",
    "magnitude_mask",
    "PolynomialDecay",
    "prunable_layers",
    "prunable_weights",
    "PrunableLayer",
    "PrunedModel",
    "prune_low_magnitude",
    "pruning_steps",
    "PruningSchedule",
    "PruningSummaries",
    "RegistryEntry",
    "schedule_table",
    "strip_pruning",
    "UpdatePruningStep",
]
