"""maskfit.pruning: magnitude pruning for Keras 3, with TF-MOT's names and semantics.

Structured pruning (whole units, with Torch-Pruning's names) is the package
`maskfit.structured`; its public names are exported here too.

It imports the packages below it (`internals`, `units`, `kinds`, `spec`,
`model`), `checks`, `scalars` and `support`, and `structured` for the names
it re-exports.
"""

from maskfit.pruning.callbacks import PruningSummaries, UpdatePruningStep
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

# Structured pruning is its own package, `maskfit.structured`; its names stay
# available here, where 0.1.0 documented them.
from maskfit.structured import (
    ActivationImportance,
    Coupling,
    DependencyGraph,
    Importance,
    MagnitudeImportance,
    SizeReport,
    TaylorImportance,
    UnitCoupling,
    UnitGroup,
    UnitPruning,
    UnitSelection,
    coupling_of,
    prune_units,
    register_coupling,
    select_units,
    shrink,
    size_report,
    unit_selection,
)

__all__ = [
    "ActivationImportance",
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
