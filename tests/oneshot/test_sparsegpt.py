"""SparseGPT's lazy blocked update against a plain NumPy one, and the choices of nm/wanda.

The reference below is written from the paper's equations, not from
`sparsegpt.prune`: each column in turn, the inverse of the Hessian of the
columns not yet processed taken explicitly (`inv(H[j:, j:])`), the pruned
column's error spread over the later columns at once (no blocks, no Cholesky
factor). The lazy blocked update with the Cholesky factor must give the same
weights and the same choice.
"""

import numpy as np
import pytest

from maskfit.oneshot import nm, sparsegpt, targets, wanda

pytestmark = pytest.mark.backends("tensorflow", "jax")


def _reference(weights, H, goal, blocksize, percdamp=0.01):
    """Column-by-column OBS: `inv(H[j:, j:])` taken anew for every column."""
    W = np.array(weights, np.float64).T  # (out, in)
    H = H + percdamp * np.mean(np.diag(H)) * np.eye(len(H))
    rows, columns = W.shape
    pruned = np.zeros_like(W, bool)

    def saliency(j):  # the paper's w^2 / [H_F^-1]_jj, F the columns from j on
        return W[:, j] ** 2 / np.linalg.inv(H[j:, j:])[0, 0]

    for j in range(columns):
        if j % blocksize == 0 and not goal.m:
            end = min(j + blocksize, columns)
            scores = np.stack([saliency(k) for k in range(j, end)], 1)
            count = int(scores.size * goal.sparsity)
            flat = np.argsort(scores, axis=None, kind="stable")[:count]
            block = np.zeros(scores.size, bool)
            block[flat] = True
            pruned[:, j:end] = block.reshape(scores.shape)
        if goal.m and j % goal.m == 0:
            scores = np.stack([saliency(k) for k in range(j, j + goal.m)], 1)
            order = np.argsort(scores, axis=1, kind="stable")[:, : goal.n]
            np.put_along_axis(pruned[:, j : j + goal.m], order, True, axis=1)
        inverse = np.linalg.inv(H[j:, j:])
        q = np.where(pruned[:, j], 0.0, W[:, j])
        W[:, j:] -= np.outer((W[:, j] - q) / inverse[0, 0], inverse[0])
        W[:, j] = q
    return W.T, pruned.T


def _problem(rows=12, columns=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(200, rows)) @ rng.normal(size=(rows, rows))  # correlated
    weights = rng.normal(size=(rows, columns))
    return weights, sparsegpt.hessian(x.T @ x, len(x))


@pytest.mark.parametrize(
    "sparsity, pattern", [(0.5, None), (0.7, None), (None, "2:4"), (None, "4:8")]
)
def test_lazy_blocked_update_matches_the_column_by_column_one(sparsity, pattern):
    weights, H = _problem(rows=16, columns=12)
    goal = targets.target("sparsegpt", sparsity, pattern, 8)
    got, pruned, loss = sparsegpt.prune(weights, H, goal, blocksize=8)
    expected, expected_pruned = _reference(weights, H, goal, blocksize=8)
    np.testing.assert_array_equal(pruned, expected_pruned)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(got[pruned], 0.0)
    assert loss > 0
    if pattern:  # N of every M consecutive inputs of each output
        n, m = goal.n, goal.m
        np.testing.assert_array_equal(pruned.reshape(-1, m, 12).sum(1), n)
    else:  # int(size * s) of each column block of 8 inputs
        per_block = int(8 * 12 * sparsity)
        assert pruned.sum() == 2 * per_block


def test_the_reference_differs_when_blocks_are_wrongly_lazy():
    """The comparison can fail: skipping the lazy update of later blocks shows."""
    weights, H = _problem(rows=16, columns=12)
    goal = targets.target("sparsegpt", 0.5, None, 8)
    expected, _ = _reference(weights, H, goal, blocksize=8)
    got, _, _ = sparsegpt.prune(weights, H, goal, blocksize=8)
    wrong = weights.copy()
    wrong[:8], _, _ = sparsegpt.prune(weights[:8], H[:8, :8], goal, blocksize=8)
    assert not np.allclose(wrong, expected, atol=1e-6)
    assert np.allclose(got, expected, atol=1e-9)


def test_dead_inputs_get_zero_weights_and_a_unit_diagonal():
    weights, H = _problem()
    H[3, :] = H[:, 3] = 0.0
    goal = targets.target("sparsegpt", 0.5, None, 128)
    got, _, _ = sparsegpt.prune(weights, H, goal)
    np.testing.assert_array_equal(got[3], 0.0)
    assert np.all(np.isfinite(got))


def test_wanda_compares_per_output_and_magnitude_over_the_layer():
    weights = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])
    half = targets.target("wanda", 0.5, None, 128)
    _, by_output = wanda.wanda(weights, np.ones(4), half)
    np.testing.assert_array_equal(by_output, [[1, 1], [1, 1], [0, 0], [0, 0]])
    # The input norms turn the order: input 0 is read 100 times as strongly.
    _, scaled = wanda.wanda(weights, np.array([1e4, 1.0, 1.0, 1.0]), half)
    np.testing.assert_array_equal(scaled, [[0, 0], [1, 1], [1, 1], [0, 0]])
    _, by_layer = wanda.magnitude(weights, targets.target("magnitude", 0.5, None, 128))
    np.testing.assert_array_equal(by_layer, [[1, 0], [1, 0], [1, 0], [1, 0]])


def test_n_of_m_groups_run_along_the_inputs_and_ties_go_to_the_lower_index():
    scores = np.array([[3.0, 1.0], [1.0, 1.0], [2.0, 1.0], [0.0, 1.0]])
    np.testing.assert_array_equal(
        nm.n_of_m(scores, 2, 4), [[0, 1], [1, 1], [0, 0], [1, 0]]
    )
    np.testing.assert_array_equal(nm.smallest(np.ones((2, 2)), 3), [[1, 1], [1, 0]])
