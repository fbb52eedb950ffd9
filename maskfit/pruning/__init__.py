"""maskfit.pruning: magnitude pruning for Keras 3, with TF-MOT's names and semantics,
and structured pruning (whole units) with Torch-Pruning's."""

from maskfit.pruning.callbacks import PruningSummaries
from maskfit.pruning.couplings import Coupling
from maskfit.pruning.couplings import UnitCoupling
from maskfit.pruning.couplings import coupling_of
from maskfit.pruning.couplings import register_coupling
from maskfit.pruning.importance import Importance
from maskfit.pruning.importance import MagnitudeImportance
from maskfit.pruning.importance import TaylorImportance
from maskfit.pruning.callbacks import UpdatePruningStep
from maskfit.pruning.magnitude import kept_count
from maskfit.pruning.magnitude import magnitude_mask
from maskfit.pruning.prune import PrunedModel
from maskfit.pruning.prune import prune_low_magnitude
from maskfit.pruning.prune import strip_pruning
from maskfit.pruning.structured import UnitSelection
from maskfit.pruning.structured import prune_units
from maskfit.pruning.structured import select_units
from maskfit.pruning.structured import unit_selection
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
from maskfit.pruning.shrinking import shrink
from maskfit.pruning.sizes import SizeReport
from maskfit.pruning.sizes import size_report
from maskfit.pruning.unit_graph import DependencyGraph
from maskfit.pruning.unit_graph import UnitGroup
from maskfit.pruning.unit_rule import UnitPruning

__all__ = [
    "classify",
    "ConstantSparsity",
    "Coupling",
    "coupling_of",
    "DependencyGraph",
    "Importance",
    "MagnitudeImportance",
    "kept_count",
    "MagnitudePruning",
    "magnitude_mask",
    "PolynomialDecay",
    "prunable_layers",
    "prunable_weights",
    "PrunableLayer",
    "PrunedModel",
    "prune_low_magnitude",
    "prune_units",
    "pruning_steps",
    "PruningSchedule",
    "PruningSummaries",
    "register_coupling",
    "RegistryEntry",
    "schedule_table",
    "select_units",
    "shrink",
    "size_report",
    "SizeReport",
    "strip_pruning",
    "TaylorImportance",
    "UnitCoupling",
    "UnitGroup",
    "UnitPruning",
    "unit_selection",
    "UnitSelection",
    "UpdatePruningStep",
]
