"""SparseGPT (Frantar & Alistarh 2023, arXiv 2301.00774): prune with the inverse Hessian.

`prune` is the reference implementation's `SparseGPT.fasterprune`
(github.com/IST-DASLab/sparsegpt, `sparsegpt.py`) line for line, in NumPy
and float64, on PyTorch's `(out, in)` layout: the Hessian `H = 2 X^T X / n`
of the layer's inputs, damped by `percdamp` times its mean diagonal (inputs
never seen get `H_jj = 1` and their weights 0); the upper Cholesky factor of
its inverse; columns in blocks of `blocksize`, each pruned column's error
spread over the block's later columns at once and over the later blocks
lazily, one matrix product per block. Unstructured: in each block the
entries of smallest `w^2 / [H^-1]_jj^2` go; N:M: the N smallest of every M
columns of each row, chosen when the update reaches the group.

One difference, on purpose: the reference keeps `tmp <= sort(tmp)[k]`,
which prunes k + 1 entries of a block (k = its size times the sparsity);
here exactly k go, so a layer's sparsity is what was asked.
"""

import numpy as np

from maskfit.oneshot import nm

__all__ = ["hessian", "prune"]


def hessian(sums, count):
    """The reference's `H`: `2 / n` times the inputs' `X^T X` over `n` tokens."""
    return 2.0 * np.asarray(sums, np.float64) / max(int(count), 1)


def _inverse_cholesky(H, percdamp):
    """Upper `U` with `U^T U = (H + damp I)^-1`; raises LinAlgError if H is not PD."""
    damp = percdamp * np.mean(np.diag(H))
    H = H + damp * np.eye(len(H))
    lower = np.linalg.cholesky(H)
    inverse_lower = np.linalg.solve(lower, np.eye(len(H)))
    inverse = inverse_lower.T @ inverse_lower
    return np.linalg.cholesky(inverse).T


def prune(weights, H, target, blocksize=128, percdamp=0.01):
    """`(pruned weights, pruned mask, loss)` of the `(in, out)` matrix `weights`.

    Args:
      weights: the layer's kernel as `(in, out)` (`views.KernelView.matrix`).
      H: the Hessian `(in, in)` (`hessian`).
      target: the `targets.Target` (sparsity, or N of every M).
      blocksize: columns pruned together (128 in the paper).
      percdamp: the damping, a fraction of the mean diagonal of H.

    Returns:
      the new `(in, out)` weights, the boolean `(in, out)` mask of pruned
      entries, and the reference's loss `sum (w - q)^2 / [H^-1]_jj^2 / 2`.

    Raises:
      numpy.linalg.LinAlgError: if the damped Hessian is not positive definite.
    """
    W = np.array(weights, np.float64).T  # (out, in): rows, columns
    H = np.array(H, np.float64)
    rows, columns = W.shape
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    Hinv = _inverse_cholesky(H, percdamp)
    pruned = np.zeros_like(W, bool)
    losses = np.zeros(rows)
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        W1 = W[:, i1:i2].copy()
        Q1 = np.zeros_like(W1)
        Err1 = np.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        diagonal = np.diag(Hinv1)
        if target.m:
            mask1 = np.zeros_like(W1, bool)
        else:
            scores = W1**2 / diagonal[None, :] ** 2
            mask1 = nm.smallest(scores, int(scores.size * target.sparsity))
        for i in range(i2 - i1):
            if target.m and i % target.m == 0:
                scores = W1[:, i : i + target.m] ** 2 / diagonal[i : i + target.m] ** 2
                mask1[:, i : i + target.m] = nm.n_of_m(scores.T, target.n, target.m).T
            w = W1[:, i]
            d = Hinv1[i, i]
            q = np.where(mask1[:, i], 0.0, w)
            Q1[:, i] = q
            losses += (w - q) ** 2 / d**2 / 2
            err = (w - q) / d
            W1[:, i:] -= np.outer(err, Hinv1[i, i:])
            Err1[:, i] = err
        W[:, i1:i2] = Q1
        pruned[:, i1:i2] = mask1
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return W.T, pruned.T, float(losses.sum())
