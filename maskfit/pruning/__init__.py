"""maskfit.pruning: magnitude pruning for Keras 3, with TF-MOT's names and semantics,
and structured pruning (whole units) with Torch-Pruning's."""

from maskfit.pruning.callbacks import PruningSummaries, UpdatePruningStep
from maskfit.pruning.couplings import (
    Coupling,
    UnitCoupling,
    coupling_of,
    register_coupling,
)
from maskfit.pruning.importance import Importance, MagnitudeImportance, TaylorImportance
from maskfit.pruning.magnitude import kept_count, magnitude_mask
from maskfit.pruning.prune import PrunedModel, prune_low_magnitude, strip_pruning
from maskfit.pruning.registry import (
    PrunableLayer,
    RegistryEntry,
    classify,
    prunable_layers,
    prunable_weights,
)
from maskfit.pruning.rule import MagnitudePruning
from maskfit.pruning.schedules import (
    ConstantSparsity,
    PolynomialDecay,
    PruningSchedule,
    pruning_steps,
    schedule_table,
)
from maskfit.pruning.shrinking import shrink
from maskfit.pruning.sizes import SizeReport, size_report
from maskfit.pruning.structured import (
    UnitSelection,
    prune_units,
    select_units,
    unit_selection,
)
from maskfit.pruning.unit_graph import DependencyGraph, UnitGroup
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
