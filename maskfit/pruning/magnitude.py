"""Magnitude masks: which entries of a weight tensor survive pruning, as TF-MOT."""

import numbers

import numpy as np
import tensorflow as tf

from maskfit import checks, internals

__all__ = ["kept_count", "magnitude_mask"]

_POOLING_TYPES = ("AVG", "MAX")


def magnitude_mask(
    weights,
    sparsity,
    block_size=(1, 1),
    sparsity_m_by_n=None,
    *,
    block_pooling_type="AVG",
):
    """Returns the 0/1 mask that keeps the largest-magnitude entries of `weights`.

    TF-MOT's `pruning_impl.Pruning` mask: the same weights give the same mask,
    bit for bit (TF-MOT's ops, but for a partial sort when few entries are
    kept; weights with a NaN aside, which no sort orders). Plain TensorFlow
    ops: call it eagerly, in a `tf.function` or under `jit_compile=True`.

    - Unstructured (default): keeps `k = max(round(size * (1 - sparsity)), 1)`
      entries (round half to even, in float32); the threshold is the k-th
      largest `|w|`, and every entry with `|w| >= threshold` is kept, so ties
      with the threshold keep more than k.
    - Blocks (`block_size != (1, 1)`, rank-2 weights only): `|w|` is pooled
      over non-overlapping `block_size` blocks (`block_pooling_type` "AVG" or
      "MAX", TF-MOT's `factorized_pool` with "SAME" padding), the pooled matrix
      is masked as above, and each block takes its pooled entry's value.
      Quirk kept from TF-MOT: when a dimension is not a multiple of the block
      and the padding is 2 or more, "SAME" pooling centres its windows while
      the mask blocks start at 0, so edge blocks are scored on shifted windows.
    - N:M (`sparsity_m_by_n=(m, n)`): in every group of `n` consecutive entries
      along axis -2 (the input-channel axis of Dense and Conv kernels), the
      `m` smallest `|w|` are pruned (ties: the lower index is kept); a last,
      shorter group keeps at most `n - m`. `sparsity` is ignored. TF-MOT does
      this for rank 2 and 4; the same rule applies here to every rank >= 2.

    Args:
      weights: a float tensor or variable with a fully defined shape.
      sparsity: the fraction to prune, a float or scalar float tensor in
        [0, 1) (e.g. the second output of a `PruningSchedule`).
      block_size: `(height, width)` of the blocks, positive integers.
      sparsity_m_by_n: None, or `(m, n)` integers with `0 < m < n`.
      block_pooling_type: "AVG" (TF-MOT's default) or "MAX".

    Returns:
      A tensor of the shape and dtype of `weights`: 1 keeps, 0 prunes.

    Raises:
      ValueError: for a bad `block_size`, `sparsity_m_by_n` or pooling type,
        for blocks on weights whose rank is not 2, for N:M on weights of rank
        < 2, or when both `block_size` and `sparsity_m_by_n` are given.

    Example:

    >>> import numpy as np, maskfit.pruning as pruning
    >>> w = np.array([[0.1, -3.0], [2.0, 0.4]], np.float32)
    >>> pruning.magnitude_mask(w, 0.5).numpy().tolist()
    [[0.0, 1.0], [1.0, 0.0]]
    >>> w = np.array([[4.0], [-1.0], [3.0], [2.0]], np.float32)
    >>> pruning.magnitude_mask(w, 0.0, sparsity_m_by_n=(2, 4)).numpy().ravel().tolist()
    [1.0, 0.0, 1.0, 0.0]
    """
    weights = tf.convert_to_tensor(weights)
    where = f"magnitude_mask on weights of shape {weights.shape}"
    if not weights.shape.is_fully_defined():
        raise ValueError(f"{where}: the shape must be fully defined.")
    if not weights.dtype.is_floating:
        raise TypeError(
            f"{where}: weights must be floating point. Received dtype"
            f" {weights.dtype.name}."
        )
    block_size = _check_block_size(block_size, where)
    m_by_n = _check_m_by_n(sparsity_m_by_n, where)
    if block_pooling_type not in _POOLING_TYPES:
        raise ValueError(
            f"{where}: block_pooling_type must be 'AVG' or 'MAX'. Received:"
            f" {block_pooling_type!r}"
        )
    if m_by_n is not None and block_size != (1, 1):
        raise ValueError(
            f"{where}: block_size and sparsity_m_by_n exclude each other (TF-MOT"
            f" silently ignores block_size then). Received: block_size={block_size},"
            f" sparsity_m_by_n={m_by_n}. Pass one of them."
        )
    if m_by_n is not None:
        return _m_by_n_mask(weights, m_by_n, where)
    if isinstance(sparsity, numbers.Real) and not 0.0 <= sparsity < 1.0:
        raise ValueError(f"{where}: sparsity must be in [0, 1). Received: {sparsity}")
    sparsity = tf.cast(sparsity, tf.float32)
    if block_size == (1, 1):
        return tf.cast(_keep_largest(tf.math.abs(weights), sparsity), weights.dtype)
    if weights.shape.rank != 2:
        raise ValueError(
            f"{where}: block sparsity needs 2-dimensional weights, as in TF-MOT."
            f" Received rank {weights.shape.rank}. Use block_size=(1, 1) for it."
        )
    return tf.cast(
        _block_mask(weights, sparsity, block_size, block_pooling_type), weights.dtype
    )


def kept_count(size, sparsity):
    """How many of `size` entries an unstructured mask keeps at `sparsity` (ties aside).

    `max(round(float32(size) * (1 - sparsity)), 1)` in float32 with round half
    to even, as TF-MOT computes it; with ties at the threshold the mask keeps
    more. `sparsity` should be the float32 value a schedule returns.

    Example:

    >>> import maskfit.pruning as pruning
    >>> [pruning.kept_count(10, 0.25), pruning.kept_count(5, 0.5)]
    [8, 2]
    >>> pruning.kept_count(3, 0.9)
    1
    """
    sparsity = np.float32(sparsity)
    kept = np.round(np.float32(size) * (np.float32(1) - sparsity))
    return int(max(kept, np.float32(1)))


def _keep_largest(abs_weights, sparsity):
    """TF-MOT's `Pruning._update_mask`: a bool mask of the k largest, ties kept.

    TF-MOT sorts every entry; outside XLA this sorts only the k kept when
    they are a third or less (the same threshold and the same entry at it).
    """
    size = tf.size(abs_weights)
    k = tf.dtypes.cast(
        tf.math.maximum(
            tf.math.round(tf.dtypes.cast(size, tf.float32) * (1 - sparsity)), 1
        ),
        tf.int32,
    )
    flat = tf.reshape(abs_weights, [-1])
    if internals.tracing_for_xla():
        # XLA needs a static k.
        values, indices = tf.math.top_k(flat, k=size)
    else:
        # top_k orders ties by index in both, so the k-th entry is the full
        # sort's; taking only the kept ones costs a fraction of the sort when
        # a third or less are kept, and more than it above that.
        values, indices = tf.cond(
            3 * k <= size,
            lambda: tf.math.top_k(flat, k=k),
            lambda: tf.math.top_k(flat, k=size),
        )
    threshold = tf.gather(values, k - 1)
    threshold_position = tf.gather(indices, k - 1)
    # The entry at the threshold is kept even when a comparison with it fails.
    at_threshold = tf.one_hot(
        threshold_position, depth=size, on_value=True, off_value=False, dtype=tf.bool
    )
    return tf.math.logical_or(
        tf.math.greater_equal(abs_weights, threshold),
        tf.reshape(at_threshold, abs_weights.shape),
    )


def _block_mask(weights, sparsity, block_size, pooling_type):
    """TF-MOT's block path: pool |w| per block, mask the pooled matrix, expand."""
    height, width = weights.shape
    block_height, block_width = block_size
    pooled = _factorized_pool(tf.math.abs(weights), block_size, pooling_type)
    pooled_mask = _keep_largest(pooled, sparsity)
    expanded = tf.repeat(
        tf.repeat(pooled_mask, block_height, axis=0), block_width, axis=1
    )
    return expanded[:height, :width]


def _factorized_pool(abs_weights, block_size, pooling_type):
    """TF-MOT's `pruning_utils.factorized_pool`: block_height pooling, then block_width.

    Unlike TF-MOT it keeps the result 2-D (TF-MOT squeezes it, and fails on
    weights or pooled matrices with a dimension of 1).
    """
    height, width = abs_weights.shape
    aligned = tf.reshape(abs_weights, [1, 1, height, width])
    height_pooled = _pool_rows(aligned, block_size[0], pooling_type)
    swapped = tf.transpose(height_pooled, perm=[0, 1, 3, 2])
    width_pooled = _pool_rows(swapped, block_size[1], pooling_type)
    pooled = tf.transpose(width_pooled, perm=[0, 1, 3, 2])
    return tf.reshape(pooled, pooled.shape[2:])


def _pool_rows(matrix, size, pooling_type):
    """Pools a `[1, 1, rows, columns]` matrix over every `size` rows, as TF-MOT does."""
    return tf.nn.pool(
        matrix,
        window_shape=[1, size],
        pooling_type=pooling_type,
        strides=[1, size],
        padding="SAME",
    )


def _m_by_n_mask(weights, m_by_n, where):
    """TF-MOT's N:M mask: groups of n along axis -2, the m smallest |w| pruned."""
    rank = weights.shape.rank
    if rank < 2:
        raise ValueError(
            f"{where}: sparsity_m_by_n needs weights of rank >= 2 (groups run along"
            f" axis -2, the input channels). Received rank {rank}."
        )
    num_zeros, group = m_by_n
    # TF-MOT's layout: output channels first, groups along the input channels.
    perm = [rank - 1] + list(range(rank - 1))
    moved = tf.transpose(weights, perm)
    channels_in = weights.shape[-2]
    rows = tf.reshape(tf.math.abs(moved), [-1, channels_in])
    pad = -channels_in % group
    padded = tf.pad(rows, [[0, 0], [0, pad]])
    groups = tf.reshape(padded, [-1, group])
    _, kept = tf.math.top_k(groups, k=group - num_zeros, sorted=False)
    group_mask = tf.reduce_sum(tf.one_hot(kept, group, dtype=weights.dtype), axis=1)
    mask = tf.reshape(group_mask, padded.shape)[:, :channels_in]
    mask = tf.reshape(mask, moved.shape)
    return tf.transpose(mask, list(range(1, rank)) + [0])


def _check_block_size(block_size, where):
    try:
        values = tuple(block_size)
    except TypeError:
        values = ()
    if len(values) != 2 or not all(_is_positive_int(v) for v in values):
        raise ValueError(
            f"{where}: block_size must be 2 positive integers (height, width)."
            f" Received: {block_size!r}"
        )
    return tuple(int(v) for v in values)


def _check_m_by_n(m_by_n, where):
    if m_by_n is None:
        return None
    try:
        values = tuple(m_by_n)
    except TypeError:
        values = ()
    if (
        len(values) != 2
        or not all(_is_positive_int(v) for v in values)
        or values[0] >= values[1]
    ):
        raise ValueError(
            f"{where}: sparsity_m_by_n must be 2 integers (m, n) with 0 < m < n:"
            f" m zeros in every n consecutive entries, e.g. (2, 4). Received:"
            f" {m_by_n!r}"
        )
    return tuple(int(v) for v in values)


def _is_positive_int(value):
    return checks.is_integer(value) and value > 0
