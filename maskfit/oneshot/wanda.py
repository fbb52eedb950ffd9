"""Magnitude and Wanda: prune by a score, with no update of the weights that stay.

Wanda (Sun et al. 2023, arXiv 2306.11695, `prune_wanda` in its reference
code) scores `|W_ij| * ||X_j||_2`, the input feature's norm over the
calibration tokens, and compares the scores within each output (a row of
PyTorch's `(out, in)` weight, a column of Keras's `(in, out)` kernel).
Magnitude (the same repository's `prune_magnitude`) scores `|W_ij|` and
compares them over the whole layer. For N:M both compare within each group of
M consecutive inputs of an output.
"""

import numpy as np

from maskfit.oneshot import nm

__all__ = ["magnitude", "wanda"]


def _choose(scores, target, per_layer):
    if target.m:
        return nm.n_of_m(scores, target.n, target.m)
    if per_layer:
        return nm.smallest(scores, int(scores.size * target.sparsity))
    return nm.per_output(scores, target.sparsity)


def magnitude(weights, target):
    """`(pruned weights, pruned mask)` of the `(in, out)` matrix by `|W|` over the layer."""
    pruned = _choose(np.abs(weights), target, per_layer=True)
    return np.where(pruned, 0.0, weights), pruned


def wanda(weights, squares, target):
    """`(pruned weights, pruned mask)` by `|W| * ||X_j||`, per output.

    Args:
      weights: the `(in, out)` matrix.
      squares: each input's sum of squares over the calibration tokens, `(in,)`.
      target: the `targets.Target`.
    """
    scores = np.abs(weights) * np.sqrt(squares)[:, None]
    pruned = _choose(scores, target, per_layer=False)
    return np.where(pruned, 0.0, weights), pruned
