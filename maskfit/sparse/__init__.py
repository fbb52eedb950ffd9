"""maskfit.sparse: dynamic sparse training (SET, RigL) and its parts.

`sparsify(model, "rigl", sparsity=0.9, t_end=...)` makes a model train
sparse from its first step; the `SET` and `RigL` mask rules it declares put
together per-layer sparsities at a global budget (uniform, Erdos-Renyi,
ERK), RigL's update schedule, one traceable drop-and-grow update per
variable and random initial masks, with RigL's parameter names.
docs/sparse_training.md has the details.

It imports `spec`, `model`, `pruning` (which weights are prunable), `paths`
and `support`.
"""

from maskfit.sparse.allocation import LayerSparsity, allocate, overall_sparsity
from maskfit.sparse.distributions import DISTRIBUTIONS, active_count, layer_sparsities
from maskfit.sparse.drop_and_grow import (
    DropGrow,
    drop_count,
    drop_grow,
    set_scores,
    variable_key,
)
from maskfit.sparse.initial_masks import random_keep_mask, random_keep_masks
from maskfit.sparse.rules import SET, DynamicSparsity, RigL
from maskfit.sparse.schedule import ANNEALS, UpdateSchedule
from maskfit.sparse.sparsify import METHODS, sparsify

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
