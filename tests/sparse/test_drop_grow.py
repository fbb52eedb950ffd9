"""One drop-and-grow update: exact counts, the chosen entries, ties, frozen, modes."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from maskfit import sparse
from tests.helpers import tf_modes

_fresh_keras = tf_modes._fresh_keras
mode_name = tf_modes.mode_name


def _call(mode_name, fn, *args):
    if mode_name != "eager":
        fn = tf.function(fn, jit_compile=mode_name == "jit")
    return fn(*args)


def _drop_grow(w, k, s, f, *rest):
    return sparse.drop_grow(w, k, s, f, frozen=rest[0] if rest else None)


# One function per mode, so that a shape is compiled once for the whole file.
_UPDATES = {
    "eager": _drop_grow,
    "graph": tf.function(_drop_grow),
    "jit": tf.function(_drop_grow, jit_compile=True),
}


def _update(mode_name, weights, keep, scores, fraction, frozen=None):
    args = [tf.constant(weights), tf.constant(keep), tf.constant(scores)]
    args.append(tf.constant(fraction, tf.float32))
    if frozen is not None:
        args.append(tf.constant(frozen))
    result = _UPDATES[mode_name](*args)
    return sparse.DropGrow(*(x.numpy() for x in result))


def _reference(weights, keep, scores, fraction, frozen=None):
    """NumPy: the k smallest |w| of the droppable, the k best scores of the growable."""
    frozen = np.zeros(keep.shape, bool) if frozen is None else frozen
    droppable = (keep & ~frozen).ravel()
    growable = (~keep & ~frozen).ravel()
    count = min(int(np.float32(droppable.sum()) * np.float32(fraction)), growable.sum())
    index = np.arange(keep.size)
    magnitude = np.abs(weights.ravel())
    by_magnitude = index[droppable][
        np.lexsort((index[droppable], magnitude[droppable]))
    ]
    score = scores.ravel()
    by_score = index[growable][np.lexsort((index[growable], -score[growable]))]
    dropped = np.zeros(keep.size, bool)
    grown = np.zeros(keep.size, bool)
    dropped[by_magnitude[:count]] = True
    grown[by_score[:count]] = True
    new_keep = (keep.ravel() & ~dropped) | grown
    shape = keep.shape
    return sparse.DropGrow(
        new_keep.reshape(shape), dropped.reshape(shape), grown.reshape(shape), count
    )


def _problem(shape, density, seed, ties=False):
    rng = np.random.default_rng(seed)
    keep = rng.random(shape) < density
    weights = rng.standard_normal(shape).astype(np.float32)
    scores = rng.random(shape).astype(np.float32)
    if ties:
        weights, scores = np.round(weights, 0), np.round(scores * 3, 0)
    weights = np.where(keep, weights, 0).astype(np.float32)
    return weights, keep, scores.astype(np.float32)


def _assert_equal(result, expected):
    for name in ("keep", "dropped", "grown"):
        np.testing.assert_array_equal(
            getattr(result, name), getattr(expected, name), name
        )
    assert int(result.count) == int(expected.count)


@pytest.mark.parametrize("shape", [(40, 30), (3, 3, 4, 8), (17,)])
@pytest.mark.parametrize("fraction", [0.0, 0.3, 1.0])
def test_moves_exactly_k_smallest_out_and_k_best_in(mode_name, shape, fraction):
    weights, keep, scores = _problem(shape, 0.2, seed=len(shape))
    result = _update(mode_name, weights, keep, scores, fraction)
    _assert_equal(result, _reference(weights, keep, scores, fraction))
    assert result.keep.sum() == keep.sum()  # Constant sparsity.
    assert not np.any(result.dropped & result.grown)
    assert np.all(keep[result.dropped]) and not np.any(keep[result.grown])
    assert result.keep.dtype == bool and result.keep.shape == shape


def test_ties_go_to_the_lower_flat_index(mode_name):
    weights = np.array([[0.5, 0.5, 0.0, 0.5], [0.5, 0.0, 0.0, 0.0]], np.float32)
    keep = weights != 0
    scores = np.array([[0, 0, 1, 0], [0, 1, 1, 1]], np.float32)
    result = _update(mode_name, weights, keep, scores, 0.5)
    # Two of the four equal weights go: indices 0 and 1; two of the four equal
    # scores come in: indices 2 and 5.
    np.testing.assert_array_equal(np.flatnonzero(result.dropped), [0, 1])
    np.testing.assert_array_equal(np.flatnonzero(result.grown), [2, 5])


def test_just_dropped_entries_are_not_grown_back(mode_name):
    weights = np.array([0.1, 2.0, 0.0, 0.0], np.float32)
    keep = np.array([True, True, False, False])
    scores = np.array([9.0, 0.0, 1.0, 0.5], np.float32)  # The dropped one scores best.
    result = _update(mode_name, weights, keep, scores, 0.5)
    np.testing.assert_array_equal(result.dropped, [True, False, False, False])
    np.testing.assert_array_equal(result.grown, [False, False, True, False])


def test_frozen_entries_are_never_moved_and_do_not_count(mode_name):
    weights, keep, scores = _problem((20, 10), 0.3, seed=5)
    frozen = np.random.default_rng(6).random((20, 10)) < 0.3
    # Frozen active entries have the smallest weights, frozen inactive the best scores.
    weights = np.where(frozen & keep, np.float32(1e-6), weights)
    scores = np.where(frozen & ~keep, np.float32(100), scores)
    result = _update(mode_name, weights, keep, scores, 0.5, frozen)
    _assert_equal(result, _reference(weights, keep, scores, 0.5, frozen))
    assert not np.any(result.dropped & frozen) and not np.any(result.grown & frozen)
    np.testing.assert_array_equal(result.keep[frozen], keep[frozen])
    assert int(result.count) == int(
        np.float32((keep & ~frozen).sum()) * np.float32(0.5)
    )


def test_count_is_capped_by_the_inactive_entries(mode_name):
    weights = np.array([1.0, 2.0, 3.0, 4.0, 0.0], np.float32)
    keep = weights != 0
    result = _update(mode_name, weights, keep, np.ones(5, np.float32), 1.0)
    assert int(result.count) == 1
    np.testing.assert_array_equal(result.keep, [False, True, True, True, True])


def test_nan_weights_go_first_and_nan_scores_last(mode_name):
    weights = np.array([0.1, np.nan, 3.0, 0.0, 0.0, 0.0], np.float32)
    keep = np.array([True, True, True, False, False, False])
    scores = np.array([0, 0, 0, np.nan, 0.2, 0.1], np.float32)
    result = _update(mode_name, weights, keep, scores, 0.67)
    np.testing.assert_array_equal(np.flatnonzero(result.dropped), [0, 1])
    np.testing.assert_array_equal(np.flatnonzero(result.grown), [4, 5])


def test_signs_do_not_matter_and_negative_zero_is_zero(mode_name):
    weights = np.array([-3.0, 2.0, -0.0, 1.0, 0.0, 0.0], np.float32)
    keep = np.array([True, True, True, True, False, False])
    result = _update(mode_name, weights, keep, np.ones(6, np.float32), 0.5)
    np.testing.assert_array_equal(np.flatnonzero(result.dropped), [2, 3])


def test_shapes_are_static_under_xla():
    fn = tf.function(sparse.drop_grow, jit_compile=True)
    concrete = fn.get_concrete_function(
        tf.TensorSpec((6, 5)),
        tf.TensorSpec((6, 5), tf.bool),
        tf.TensorSpec((6, 5)),
        tf.TensorSpec((), tf.float32),
    )
    outputs = concrete.structured_outputs
    for tensor in (outputs.keep, outputs.dropped, outputs.grown):
        assert tensor.shape == (6, 5)
    assert outputs.count.shape == ()


def test_drop_count_rounds_down_in_float32_as_rigl():
    assert int(sparse.drop_count(10, 100, 0.3)) == 3  # float32(10 * 0.3) = 3.0000002
    assert int(sparse.drop_count(7, 100, 0.5)) == 3
    assert int(sparse.drop_count(100, 5, 0.3)) == 5


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 12), min_size=1, max_size=3).map(tuple),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.integers(0, 2**31 - 1),
    st.booleans(),
    st.booleans(),
)
def test_matches_the_reference_for_any_shape(
    shape, density, fraction, seed, ties, use_frozen
):
    weights, keep, scores = _problem(shape, density, seed, ties)
    frozen = None
    if use_frozen:
        frozen = np.random.default_rng(seed + 1).random(shape) < 0.2
    result = _update("eager", weights, keep, scores, np.float32(fraction), frozen)
    _assert_equal(
        result, _reference(weights, keep, scores, np.float32(fraction), frozen)
    )
    assert result.keep.sum() == keep.sum()


def _fmix32(h):
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def test_set_scores_are_the_documented_hash_in_every_mode(mode_name):
    import zlib

    shape, seed, step, key = (7, 9), 3, 2**35 + 17, 12345
    scores = _call(
        mode_name,
        lambda s: sparse.set_scores(shape, seed, s, key),
        tf.constant(step, tf.int64),
    ).numpy()
    with np.errstate(over="ignore"):
        mixed = np.uint32(zlib.crc32(f"{seed}/{key}".encode()))
        low, high = np.uint32(step & 0xFFFFFFFF), np.uint32(step >> 32)
        base = _fmix32(mixed ^ _fmix32(low ^ _fmix32(high)))
        index = np.arange(63, dtype=np.uint32)
        bits = _fmix32(_fmix32(index * np.uint32(0x9E3779B9) + base) ^ base)
    expected = ((bits >> np.uint32(8)).astype(np.float32) * 2.0**-24).reshape(shape)
    np.testing.assert_array_equal(scores, expected)


def test_set_scores_differ_by_seed_step_and_key_and_look_uniform():
    base = sparse.set_scores((200, 100), 0, 99, 1).numpy()
    for other in (
        sparse.set_scores((200, 100), 1, 99, 1),
        sparse.set_scores((200, 100), 0, 199, 1),
        sparse.set_scores((200, 100), 0, 99, 2),
    ):
        assert np.mean(base == other.numpy()) < 0.01
    assert 0 <= base.min() and base.max() < 1
    counts, _ = np.histogram(base, bins=10, range=(0, 1))
    assert counts.min() > 1800 and counts.max() < 2200  # 2000 expected per bin


def test_variable_key_is_the_crc32_of_the_key():
    import zlib

    assert (
        sparse.variable_key("dense/kernel") == zlib.crc32(b"dense/kernel") & 0x7FFFFFFF
    )
    with pytest.raises(TypeError, match="expects a variable's key"):
        sparse.variable_key(3)


def test_unknown_shapes_are_refused():
    fn = tf.function(lambda w: sparse.drop_grow(w, w > 0, w, 0.5))
    with pytest.raises(ValueError, match="fully defined shape"):
        fn.get_concrete_function(tf.TensorSpec((None, 3)))
