"""Which entries go, given scores: the k smallest, per output, or N of every M inputs.

All work on `(in, out)` matrices (`views.KernelView.matrix`) and return a
boolean matrix, True where an entry is pruned. Ties go to the lower index
(stable sorts), so a choice is the same on every machine.
"""

import numpy as np

__all__ = ["n_of_m", "per_output", "smallest"]


def smallest(scores, count):
    """The `count` smallest entries of `scores` (any shape), pruned."""
    pruned = np.zeros(scores.size, bool)
    pruned[np.argsort(scores, axis=None, kind="stable")[:count]] = True
    return pruned.reshape(scores.shape)


def per_output(scores, sparsity):
    """`int(in * sparsity)` smallest entries of each output column, pruned (Wanda's rows)."""
    count = int(scores.shape[0] * sparsity)
    order = np.argsort(scores, axis=0, kind="stable")[:count]
    pruned = np.zeros(scores.shape, bool)
    np.put_along_axis(pruned, order, True, axis=0)
    return pruned


def n_of_m(scores, n, m):
    """The `n` smallest of every `m` consecutive inputs of each output, pruned.

    `scores` has shape `(in, out)` with `in` divisible by `m`; the groups run
    along `in`, the axis the product reduces (what sparse tensor cores need).
    """
    rows, cols = scores.shape
    grouped = scores.reshape(rows // m, m, cols)
    order = np.argsort(grouped, axis=1, kind="stable")[:, :n, :]
    pruned = np.zeros(grouped.shape, bool)
    np.put_along_axis(pruned, order, True, axis=1)
    return pruned.reshape(rows, cols)
