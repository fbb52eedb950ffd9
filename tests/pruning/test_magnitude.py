"""Magnitude masks: exact counts, ties, blocks, N:M, conv kernels; eager, graph, jit."""

import numpy as np
import pytest
import tensorflow as tf

from maskfit import pruning
from tests.helpers import tf_modes

_fresh_keras = tf_modes._fresh_keras
mode_name = tf_modes.mode_name


@pytest.fixture
def run(mode_name):
    """Calls `magnitude_mask` eagerly, in a tf.function, or XLA-compiled."""

    def call(weights, sparsity, *args, **kwargs):
        def mask(w, s):
            return pruning.magnitude_mask(w, s, *args, **kwargs)

        if mode_name != "eager":
            mask = tf.function(mask, jit_compile=mode_name == "jit")
        return mask(tf.constant(weights), tf.constant(sparsity, tf.float32)).numpy()

    return call


def _distinct(shape, seed=0):
    """Weights whose magnitudes are all different (no ties)."""
    size = int(np.prod(shape))
    magnitudes = np.random.RandomState(seed).permutation(size) + 1.0
    signs = np.random.RandomState(seed + 1).choice([-1.0, 1.0], size)
    return (magnitudes * signs / size).reshape(shape).astype(np.float32)


@pytest.mark.parametrize("shape", [(64, 30), (3, 3, 4, 8), (17,), (5, 1, 7)])
def test_mask_keeps_exactly_the_k_largest(shape, mode_name):
    weights = tf.constant(_distinct(shape))
    mask_fn = lambda s: pruning.magnitude_mask(weights, s)  # noqa: E731
    if mode_name != "eager":
        mask_fn = tf.function(mask_fn, jit_compile=mode_name == "jit")
    magnitudes = np.abs(weights.numpy())

    for sparsity in (0.0, 0.3, 0.5, 0.9, 0.999):
        mask = mask_fn(tf.constant(sparsity, tf.float32)).numpy()

        assert mask.shape == shape and mask.dtype == np.float32
        assert set(np.unique(mask)) <= {0.0, 1.0}
        kept = int(mask.sum())
        assert kept == pruning.kept_count(weights.shape.num_elements(), sparsity)
        if kept < mask.size:
            assert magnitudes[mask == 1].min() > magnitudes[mask == 0].max()


@pytest.mark.parametrize(
    "size, sparsity, kept",
    [
        (10, 0.25, 8),  # 7.5 rounds to 8 (half to even).
        (5, 0.5, 2),  # 2.5 rounds to 2.
        (7, 0.5, 4),  # 3.5 rounds to 4.
        (3, 0.9, 1),  # At least one entry is kept.
        (4, 0.0, 4),
    ],
)
def test_kept_count_rounds_half_to_even_in_float32(size, sparsity, kept, run):
    assert pruning.kept_count(size, sparsity) == kept
    mask = run(_distinct((size,)), sparsity)
    assert int(mask.sum()) == kept


def test_ties_with_the_threshold_are_all_kept(run):
    weights = np.array([0.5, -1.0, 1.0, 1.0, 2.0, -0.25], np.float32)

    # k = round(6 * 0.5) = 3: the threshold is 1.0, and all three 1.0s stay.
    np.testing.assert_array_equal(run(weights, 0.5), [0, 1, 1, 1, 1, 0])
    # k = round(6 * (1 - 2/3)) = 2: still threshold 1.0, so four entries stay.
    np.testing.assert_array_equal(run(weights, 2 / 3), [0, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(
        run(np.zeros((2, 3), np.float32), 0.9), np.ones((2, 3))
    )


def test_sparsity_can_change_inside_one_compiled_function():
    weights = tf.constant(_distinct((10, 10)))
    traces = []

    @tf.function(jit_compile=True)
    def kept(sparsity):
        traces.append(1)
        return tf.reduce_sum(pruning.magnitude_mask(weights, sparsity))

    counts = [int(kept(tf.constant(s, tf.float32))) for s in (0.1, 0.5, 0.75)]

    assert counts == [90, 50, 25] and len(traces) == 1


def test_mask_has_the_dtype_of_the_weights():
    weights = tf.constant(_distinct((4, 4)), tf.float16)
    mask = pruning.magnitude_mask(weights, 0.5)
    assert mask.dtype == tf.float16 and int(tf.reduce_sum(mask)) == 8


_BLOCK_WEIGHTS = np.array(
    [
        [1.0, 1.0, 0.0, 8.0],
        [1.0, 1.0, 0.0, 0.0],
        [2.0, 2.0, 3.0, 0.0],
        [2.0, -2.0, 0.0, 3.0],
    ],
    np.float32,
)


@pytest.mark.parametrize(
    "pooling, expected",
    [
        # Block averages [[1, 2], [2, 1.5]]: the two 2s stay.
        ("AVG", [[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]),
        # Block maxima [[1, 8], [2, 3]]: 8 and 3 stay.
        ("MAX", [[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]]),
    ],
)
def test_blocks_are_scored_by_their_pooled_magnitude(pooling, expected, run):
    mask = run(_BLOCK_WEIGHTS, 0.5, (2, 2), block_pooling_type=pooling)
    np.testing.assert_array_equal(mask, expected)


def test_blocks_on_shapes_that_are_not_multiples_of_the_block(run):
    weights = _distinct((7, 10), seed=3)

    mask = run(weights, 0.5, (2, 3))

    # Blocks start at 0: each aligned 2x3 block (cut at the edges) is all 0 or all 1.
    for rows in range(0, 7, 2):
        for cols in range(0, 10, 3):
            block = mask[rows : rows + 2, cols : cols + 3]
            assert block.min() == block.max()
    # 4x4 pooled blocks, half of them kept: k = round(16 * 0.5).
    kept_blocks = sum(mask[r, c] for r in range(0, 7, 2) for c in range(0, 10, 3))
    assert kept_blocks == 8


def test_blocks_keep_tfmots_same_padding_shift(run):
    # 6 rows in blocks of 4: "SAME" pooling pads 1 row before and 1 after, so it
    # scores rows {0, 1, 2} and {3, 4, 5}, while the mask blocks are rows
    # {0..3} and {4, 5}. TF-MOT does this; so do we (see magnitude_mask).
    weights = np.array([[0.0], [0.0], [0.0], [10.0], [0.0], [0.0]], np.float32)

    mask = run(weights, 0.5, (4, 1), block_pooling_type="MAX")

    np.testing.assert_array_equal(mask.ravel(), [0, 0, 0, 0, 1, 1])


def test_blocks_work_on_matrices_with_a_dimension_of_one(run):
    # TF-MOT squeezes this to rank 1 and fails; the block maxima are [2, 9, 0.5].
    weights = np.array([[1.0, 2.0, 9.0, 8.0, 0.5, 0.1]], np.float32)
    mask = run(weights, 0.6, (1, 2), block_pooling_type="MAX")
    # k = round(3 * 0.4) = 1: only the block of 9 stays.
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1, 0, 0]])


def _groups_along_input_channels(mask, group):
    """The mask as (..., groups, group) with groups running along axis -2."""
    moved = np.moveaxis(mask, -2, -1)
    channels_in = moved.shape[-1]
    full = channels_in // group * group
    return moved[..., :full].reshape(moved.shape[:-1] + (-1, group)), moved[..., full:]


@pytest.mark.parametrize("shape", [(8, 6), (3, 3, 8, 16), (5, 12, 4), (10, 3)])
def test_two_of_four_prunes_two_in_every_four_input_channels(shape, run):
    weights = _distinct(shape, seed=5)

    mask = run(weights, 0.0, sparsity_m_by_n=(2, 4))

    groups, rest = _groups_along_input_channels(mask, 4)
    np.testing.assert_array_equal(groups.sum(-1), 2)
    # A last group of 2 (10 = 4 + 4 + 2) keeps both: at most n - m are kept.
    np.testing.assert_array_equal(rest, 1)
    # The kept pair is the larger pair of each group.
    values, _ = _groups_along_input_channels(np.abs(weights), 4)
    kept_min = np.where(groups == 1, values, np.inf).min(-1)
    pruned_max = np.where(groups == 0, values, -np.inf).max(-1)
    assert np.all(kept_min > pruned_max)


def test_two_of_four_ties_keep_the_lower_input_channel(run):
    weights = np.ones((8, 2), np.float32)
    mask = run(weights, 0.0, sparsity_m_by_n=(2, 4))
    np.testing.assert_array_equal(mask[:, 0], [1, 1, 0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(mask[:, 1], mask[:, 0])


def test_m_by_n_ignores_the_sparsity():
    weights = _distinct((8, 4))
    np.testing.assert_array_equal(
        pruning.magnitude_mask(weights, 0.9, sparsity_m_by_n=(1, 4)),
        pruning.magnitude_mask(weights, 0.0, sparsity_m_by_n=(1, 4)),
    )


@pytest.mark.parametrize(
    "weights, kwargs, error, message",
    [
        (np.ones((2, 2, 2)), dict(block_size=(2, 2)), ValueError, "2-dimensional"),
        (np.ones((4,)), dict(sparsity_m_by_n=(2, 4)), ValueError, "rank >= 2"),
        (
            np.ones((4, 4)),
            dict(block_size=(2, 2), sparsity_m_by_n=(2, 4)),
            ValueError,
            "exclude each other",
        ),
        (np.ones((4, 4)), dict(block_size=(0, 2)), ValueError, "2 positive integers"),
        (np.ones((4, 4)), dict(block_size=2), ValueError, "2 positive integers"),
        (np.ones((4, 4)), dict(sparsity_m_by_n=(4, 2)), ValueError, "0 < m < n"),
        (np.ones((4, 4)), dict(sparsity_m_by_n=(2.0, 4)), ValueError, "0 < m < n"),
        (np.ones((4, 4)), dict(sparsity_m_by_n=(True, 4)), ValueError, "0 < m < n"),
        (
            np.ones((4, 4)),
            dict(block_size=(2, 2), block_pooling_type="SUM"),
            ValueError,
            "'AVG' or 'MAX'",
        ),
        (np.ones((4, 4), np.int32), {}, TypeError, "floating point"),
    ],
)
def test_bad_arguments_raise_one_clear_error(weights, kwargs, error, message):
    with pytest.raises(error, match=message):
        pruning.magnitude_mask(tf.constant(weights), 0.5, **kwargs)


def test_a_python_sparsity_out_of_range_raises():
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\)"):
        pruning.magnitude_mask(np.ones((2, 2), np.float32), 1.0)
