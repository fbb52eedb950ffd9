"""The import path of the dropped-entry traits in maskfit 0.1.0 (docs/pruning.md).

They live in `maskfit.optim.traits`, with the other traits of optimizers.
"""

from maskfit.optim.traits import keeps_dropped_entries_at_zero, state_of

__all__ = ["keeps_dropped_entries_at_zero", "state_of"]
