"""maskfit.structured: whole units, channels and heads removed, then the model shrunk.

Structured pruning through a dependency graph: which entries of a model's
variables go together when a unit is removed (`DependencyGraph`, built from
each layer's `Coupling`), unit scores (`MagnitudeImportance`,
`TaylorImportance`, `ActivationImportance`), gradual removal inside `fit`
(`prune_units`, `UnitPruning`) or in one shot (`select_units`), and `shrink`:
a smaller stock Keras model without the removed units (`size_report` counts
what went). Its schedules are magnitude pruning's
(`maskfit.pruning.PolynomialDecay`, `ConstantSparsity`); every name here is
also exported by `maskfit.pruning`. docs/structured_pruning.md has the details.

The package, by idea (each sub-package's docstring says what it may import):

- the entry points, here: `prune.py` (`prune_units`, `select_units`),
  `rule.py` (`UnitPruning`), `shrinking.py` (`shrink`), `sizes.py`
  (`size_report`); they may import the three sub-packages below;
- `graph/`: the dependency graph (a model's calls, unit nodes,
  `DependencyGraph`, `explain`), built from the couplings of
  `maskfit.kinds`;
- `hub/`: keras_hub's transformer blocks (their couplings, gradient check,
  shrinking into the same class or a twin, stock rebuilds);
- `derive/`: couplings derived by tracing a layer's call (a jaxpr), the
  last fallback of `coupling_of`, for layers no record or spec names;
- `scoring/`: unit importances (magnitude, Taylor, activations) and which
  units stay.

The coupling classes of Keras's own layers are not here: they live beside the
records that name them, in `maskfit.kinds` (which never imports this package).
"""

from maskfit.kinds.couplings.base import Coupling, UnitCoupling
from maskfit.kinds.couplings.lookup import coupling_of, register_coupling
from maskfit.structured.derive import coupling as _derived  # noqa: F401 - adds its fallback
from maskfit.structured.graph.dependency import DependencyGraph, UnitGroup
from maskfit.structured.prune import (
    UnitSelection,
    prune_units,
    select_units,
    unit_selection,
)
from maskfit.structured.rule import UnitPruning
from maskfit.structured.scoring.activation import ActivationImportance
from maskfit.structured.scoring.importance import (
    Importance,
    MagnitudeImportance,
    TaylorImportance,
)
from maskfit.structured.shrinking import shrink
from maskfit.structured.sizes import SizeReport, size_report

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
