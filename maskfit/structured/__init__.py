"""maskfit.structured: whole units, channels and heads removed, then the model shrunk.

Structured pruning through a dependency graph: which entries of a model's
variables go together when a unit is removed (`DependencyGraph`, built from
each layer's `Coupling`), unit scores (`MagnitudeImportance`,
`TaylorImportance`, `ActivationImportance`), gradual removal inside `fit` (`prune_units`,
`UnitPruning`) or in one shot (`select_units`), and `shrink`: a smaller
stock Keras model without the removed units (`size_report` counts what went).
Its schedules are magnitude pruning's (`maskfit.pruning.PolynomialDecay`,
`ConstantSparsity`); every name here is also exported by `maskfit.pruning`.
docs/structured_pruning.md has the details.
"""

from maskfit.structured.activation import ActivationImportance
from maskfit.structured.couplings import (
    Coupling,
    UnitCoupling,
    coupling_of,
    register_coupling,
)
from maskfit.structured.importance import (
    Importance,
    MagnitudeImportance,
    TaylorImportance,
)
from maskfit.structured.shrinking import shrink
from maskfit.structured.sizes import SizeReport, size_report
from maskfit.structured.structured import (
    UnitSelection,
    prune_units,
    select_units,
    unit_selection,
)
from maskfit.structured.unit_graph import DependencyGraph, UnitGroup
from maskfit.structured.unit_rule import UnitPruning

__all__ = [
    "ActivationImportance",
    "Coupling",
    "coupling_of",
    "DependencyGraph",
    "Importance",
    "MagnitudeImportance",
    "prune_units",
    "register_coupling",
    "select_units",
    "shrink",
    "size_report",
    "SizeReport",
    "TaylorImportance",
    "UnitCoupling",
    "UnitGroup",
    "UnitPruning",
    "unit_selection",
    "UnitSelection",
]
