"""One mask update of dynamic sparse training: drop the weakest, grow the best.

`drop_grow` moves `k` connections of one variable: it drops the `k` active
entries of smallest `|w|` and grows the `k` inactive entries of largest
growth score (|dense gradient| for RigL, a random draw for SET), so the
number of active entries stays the same. It is plain TensorFlow with static
shapes (eager, `tf.function`, `jit_compile=True`), and deterministic: ties
go to the lower flat index, so every replica that sees the same weights and
scores makes the same choice. `set_scores` draws SET's scores statelessly
from (seed, step, variable key), the same on every replica and on resume.
"""

import collections
import zlib

import tensorflow as tf

__all__ = ["DropGrow", "drop_count", "drop_grow", "set_scores", "variable_key"]


class DropGrow(
    collections.namedtuple("DropGrow", ["keep", "dropped", "grown", "count"])
):
    """What one update did to a variable.

    Attributes:
      keep: bool, the variable's shape: the new keep mask.
      dropped: bool: entries active before and dropped now (to set to +0.0).
      grown: bool: entries inactive before and active now (to start at +0.0
        with fresh optimizer state). Disjoint from `dropped`.
      count: int32 scalar: how many were dropped (= how many were grown).

    Example:

    >>> import tensorflow as tf, maskfit.sparse as sparse
    >>> update = sparse.drop_grow(
    ...     weights=tf.constant([0.5, -0.1, 0.0, 0.0]),
    ...     keep=tf.constant([True, True, False, False]),
    ...     grow_scores=tf.constant([0.0, 0.0, 1.0, 2.0]),
    ...     drop_fraction=0.5)
    >>> update.dropped.numpy().tolist(), update.grown.numpy().tolist()
    ([False, True, False, False], [False, False, False, True])
    >>> update.keep.numpy().tolist(), int(update.count)
    ([True, False, False, True], 1)
    """


def drop_count(droppable, growable, drop_fraction):
    """How many entries one update moves, as RigL counts them.

    `int(float32(droppable) * drop_fraction)` (RigL's `n_prune`), at most
    `growable`. Works on Python numbers and on tensors.

    Example:

    >>> int(drop_count(200, 800, 0.3)), int(drop_count(200, 10, 0.3))
    (60, 10)
    """
    droppable = tf.cast(droppable, tf.float32)
    count = tf.cast(droppable * tf.cast(drop_fraction, tf.float32), tf.int32)
    return tf.minimum(count, tf.cast(growable, tf.int32))


def drop_grow(weights, keep, grow_scores, drop_fraction, frozen=None):
    """Moves `drop_count(...)` active entries of `weights` to where growth scores most.

    - Droppable: active (`keep`) and not `frozen`. The `k` droppable
      entries of smallest `|weights|` are dropped (a NaN weight counts as
      smallest: it is dropped first).
    - Growable: inactive, not `frozen`, and not just dropped (RigL's own
      code lets a just-dropped entry be grown back, keeping its value and
      optimizer state; here the two sets are disjoint, so exactly `k` move).
      The `k` growable entries of largest `grow_scores` are grown (NaN scores
      last).
    - `k = drop_count(#droppable, #growable before the drop, drop_fraction)`.

    Ties go to the lower flat (row-major) index, in both choices.

    Args:
      weights: a float tensor with a fully defined shape; inactive entries
        are normally 0 (their values are not read).
      keep: bool (or 0/1) tensor of the same shape: the active entries.
      grow_scores: float tensor of the same shape (larger grows first).
      drop_fraction: float or scalar tensor in [0, 1].
      frozen: None, or a bool tensor of the same shape: entries that must not
        move (frozen by `maskfit.set_mask`); they are never dropped or grown.

    Returns:
      A `DropGrow`.

    Example:

    >>> w = tf.constant([[0.5, -0.1, 0.0], [0.3, 0.0, 0.0]])
    >>> keep = tf.constant([[True, True, False], [True, False, False]])
    >>> scores = tf.constant([[0.0, 0.0, 2.0], [0.0, 1.0, 5.0]])
    >>> update = drop_grow(w, keep, scores, 0.5)
    >>> update.keep.numpy().astype(int).tolist()
    [[1, 0, 0], [1, 0, 1]]
    >>> int(update.count)
    1
    """
    weights = tf.convert_to_tensor(weights)
    if not weights.shape.is_fully_defined():
        raise ValueError(
            f"drop_grow needs weights with a fully defined shape. Received:"
            f" {weights.shape}"
        )
    shape = weights.shape
    flat = lambda x: tf.reshape(x, [-1])  # noqa: E731
    keep = flat(tf.cast(keep, tf.bool))
    free = tf.ones_like(keep) if frozen is None else ~flat(tf.cast(frozen, tf.bool))
    droppable = keep & free
    growable = ~keep & free
    count = drop_count(_count(droppable), _count(growable), drop_fraction)

    # Ascending int64 keys: the `count` smallest are chosen, ties to the lower
    # index; entries that are not candidates get a key above every candidate's.
    magnitude = _ordered(tf.math.abs(flat(weights)))
    drop_key = tf.where(
        tf.math.is_nan(flat(weights)), tf.constant(_NAN_FIRST, tf.int32), magnitude
    )
    outside = tf.constant(_OUTSIDE, tf.int32)
    dropped = _smallest(tf.where(droppable, drop_key, outside), count)

    scores = flat(tf.convert_to_tensor(grow_scores))
    grow_key = tf.where(
        tf.math.is_nan(scores), tf.constant(_NAN_LAST, tf.int32), -_ordered(scores)
    )
    # Just-dropped entries are active in `keep`, so never candidates here.
    grown = _smallest(tf.where(growable, grow_key, outside), count)

    new_keep = (keep & ~dropped) | grown
    unflat = lambda x: tf.reshape(x, shape)  # noqa: E731
    return DropGrow(unflat(new_keep), unflat(dropped), unflat(grown), count)


def set_scores(shape, seed, step, key):
    """SET's growth scores: uniform in [0, 1) on a 2**-24 grid, from (seed, step, key).

    A counter-based hash (murmur3's 32-bit finalizer over the entry's flat
    index, the step and a mix of `seed` and `key`), in integer ops only, so
    eager, graph and XLA give the same bits, on every replica and after a
    resume. (`tf.random.stateless_uniform` would not: on TensorFlow 2.21 the
    same seed draws other numbers under `jit_compile=True` than outside it,
    so a run's masks would depend on the compile mode.)

    Args:
      shape: the variable's shape (static).
      seed: the rule's seed, a Python int.
      step: the optimizer step, an integer scalar tensor or int.
      key: the variable's key (`variable_key`), a Python int.

    Returns:
      A float32 tensor of `shape`.

    Example:

    >>> a = set_scores((2, 3), seed=0, step=99, key=1)
    >>> b = tf.function(set_scores, jit_compile=True)((2, 3), 0, 99, 1)
    >>> bool(tf.reduce_all(a == b))
    True
    """
    size = 1
    for dim in shape:
        size *= int(dim)
    mixed = zlib.crc32(f"{int(seed)}/{int(key)}".encode())
    step = tf.cast(step, tf.int64)
    low = tf.cast(tf.bitwise.bitwise_and(step, 0xFFFFFFFF), tf.uint32)
    high = tf.cast(tf.bitwise.right_shift(step, 32), tf.uint32)
    base = _fmix32(tf.constant(mixed, tf.uint32) ^ _fmix32(low ^ _fmix32(high)))
    index = tf.cast(tf.range(size), tf.uint32)
    bits = _fmix32(_fmix32(index * tf.constant(_GOLDEN, tf.uint32) + base) ^ base)
    uniform = tf.cast(tf.bitwise.right_shift(bits, 8), tf.float32) * (2.0**-24)
    return tf.reshape(uniform, shape)


def variable_key(key):
    """A stable integer for a variable's key (a str): its CRC-32, the same in every process.

    `key` is the variable's `LayerSparsity.key` (its layer path and name).
    Python's `hash` of a string changes between processes, so RigL's
    `hash(var.name)` seeds differ between workers; this does not.

    Example:

    >>> variable_key("dense/kernel")
    988593171
    """
    if not isinstance(key, str):
        raise TypeError(
            "variable_key expects a variable's key (a str such as"
            f" 'dense_1/kernel'). Received: {key!r} of type {type(key).__name__}"
        )
    return zlib.crc32(key.encode()) & 0x7FFFFFFF


_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive indices


def _fmix32(h):
    """murmur3's finalizer on uint32 tensors (wrapping arithmetic)."""

    def shift(x, n):
        return tf.bitwise.right_shift(x, tf.constant(n, tf.uint32))

    h = (h ^ shift(h, 16)) * tf.constant(0x85EBCA6B, tf.uint32)
    h = (h ^ shift(h, 13)) * tf.constant(0xC2B2AE35, tf.uint32)
    return h ^ shift(h, 16)


def _count(mask):
    return tf.reduce_sum(tf.cast(mask, tf.int32))


def _ordered(values):
    """int32 keys in the order of float `values` (as float32); -0.0 equals +0.0.

    A non-negative float's bits order as integers; a negative one's
    magnitude bits are flipped below zero, so keys of non-NaN values lie in
    [-0x7F800001, 0x7F800000] (-inf to +inf). NaNs are the caller's.
    """
    values = tf.cast(values, tf.float32)
    values = tf.where(values == 0, tf.zeros_like(values), values)  # -0.0 -> +0.0
    bits = tf.bitcast(values, tf.int32)
    return tf.where(bits < 0, -tf.bitwise.bitwise_and(bits, 0x7FFFFFFF) - 1, bits)


# Keys just outside the range of `_ordered` (and of its negation).
_NAN_FIRST = -0x7F800002
_NAN_LAST = 0x7F800002
_OUTSIDE = 0x7F800003


def _smallest(keys, count):
    """Bool: exactly `count` entries of smallest key, ties to the lower flat index.

    A selection without a sort (sorting a million entries costs seconds on a
    CPU, under XLA most): bisection for the smallest key with at least
    `count` keys at or below it (at most 32 counting passes), then, among the
    keys equal to it, bisection for the flat index below which enough of them
    lie (at most log2(size) passes). `count` must not exceed the number of
    candidates (keys below `_OUTSIDE`).
    """
    count = tf.cast(count, tf.int32)
    # Bounds are int64 (their difference can pass 2**31); each one lies in
    # [min(keys) - 1, max(keys)], which fits the int32 keys.
    threshold = _least_reaching(
        lambda t: _count(keys <= tf.cast(t, tf.int32)),
        tf.cast(tf.reduce_min(keys), tf.int64) - 1,
        tf.cast(tf.reduce_max(keys), tf.int64),
        count,
    )
    below = keys < tf.cast(threshold, tf.int32)
    ties = keys == tf.cast(threshold, tf.int32)
    needed = count - _count(below)
    size = tf.size(keys, out_type=tf.int64)
    index = tf.range(tf.size(keys), dtype=tf.int32)

    def first_of_ties():
        return _least_reaching(
            lambda j: _count(ties & (index <= tf.cast(j, tf.int32))),
            tf.constant(-1, tf.int64),
            size - 1,
            needed,
        )

    # Usually every tie is taken (continuous scores): no second bisection.
    last = tf.cond(needed < _count(ties), first_of_ties, lambda: size - 1)
    return below | (ties & (index <= tf.cast(last, tf.int32)) & (needed > 0))


def _least_reaching(counted, low, high, count):
    """The least `t` in (low, high] with `counted(t) >= count` (`counted` rising).

    Bisection; expects `counted(low) < count <= counted(high)` (else it
    returns `low + 1`).
    """

    def body(low, high):
        middle = low + (high - low) // 2
        enough = counted(middle) >= count
        return tf.where(enough, low, middle), tf.where(enough, middle, high)

    _, high = tf.while_loop(
        lambda low, high: high - low > 1, body, (low, high), maximum_iterations=64
    )
    return high
