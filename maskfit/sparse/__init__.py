"""maskfit.sparse: dynamic sparse training (SET, RigL) and its parts.

`sparsify(model, "rigl", sparsity=0.9, t_end=...)` makes a model train
sparse from its first step; the `SET` and `RigL` mask rules it declares put
together per-layer sparsities at a global budget (uniform, Erdos-Renyi,
ERK), RigL's update schedule, one traceable drop-and-grow update per
variable and random initial masks, with RigL's parameter names.
docs/sparse_training.md has the details.
"""

from maskfit.sparse.allocation import LayerSparsity
from maskfit.sparse.allocation import allocate
from maskfit.sparse.allocation import overall_sparsity
from maskfit.sparse.distributions import DISTRIBUTIONS
from maskfit.sparse.distributions import active_count
from maskfit.sparse.distributions import layer_sparsities
from maskfit.sparse.drop_and_grow import DropGrow
from maskfit.sparse.drop_and_grow import drop_count
from maskfit.sparse.drop_and_grow import drop_grow
from maskfit.sparse.drop_and_grow import set_scores
from maskfit.sparse.drop_and_grow import variable_key
from maskfit.sparse.initial_masks import random_keep_mask
from maskfit.sparse.initial_masks import random_keep_masks
from maskfit.sparse.rules import DynamicSparsity
from maskfit.sparse.rules import RigL
from maskfit.sparse.rules import SET
from maskfit.sparse.schedule import ANNEALS
from maskfit.sparse.schedule import UpdateSchedule
from maskfit.sparse.sparsify import METHODS
from maskfit.sparse.sparsify import sparsify

__all__ = [
    "active_count",
    "allocate",
    "ANNEALS",
    "DISTRIBUTIONS",
    "drop_count",
    "drop_grow",
    "DropGrow",
    "DynamicSparsity",
    "LayerSparsity",
    "layer_sparsities",
    "METHODS",
    "overall_sparsity",
    "random_keep_mask",
    "random_keep_masks",
    "RigL",
    "set_scores",
    "SET",
    "sparsify",
    "UpdateSchedule",
    "variable_key",
]
