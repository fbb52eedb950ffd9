"""maskfit.pruning against TF-MOT's own code, bit for bit (needs the pruning-peer extra).

The same ops on the same inputs in the same execution mode: schedules and
masks must be identical, not close.
"""

import os

import hypothesis
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

from maskfit import pruning
from tests.pruning.test_schedules import TFMOT_EXAMPLE


def _import_tfmot():
    # Importing TF-MOT sets TF_USE_LEGACY_KERAS=1 for the process (it makes
    # `tf.keras` tf_keras); put the variable back so that nothing started
    # later (subprocesses of other tests) inherits it.
    before = os.environ.get("TF_USE_LEGACY_KERAS")
    try:
        tfmot = pytest.importorskip("tensorflow_model_optimization")
        from tensorflow_model_optimization.python.core.sparsity.keras import (
            prune_registry,
            pruning_impl,
        )
    finally:
        if before is None:
            os.environ.pop("TF_USE_LEGACY_KERAS", None)
        else:
            os.environ["TF_USE_LEGACY_KERAS"] = before
    return tfmot.sparsity.keras, pruning_impl, prune_registry


sparsity_api, pruning_impl, prune_registry = _import_tfmot()


@pytest.fixture(autouse=True)
def _fresh_keras():
    """Overrides conftest's: no gc.collect per test (~0.3 s); fresh names."""
    keras.backend.clear_session(free_memory=False)
    yield


_SCHEDULES = [
    ("PolynomialDecay", TFMOT_EXAMPLE),
    (
        "PolynomialDecay",
        dict(
            initial_sparsity=0.1,
            final_sparsity=0.95,
            begin_step=7,
            end_step=623,
            power=2,
            frequency=3,
        ),
    ),
    (
        "PolynomialDecay",
        dict(
            initial_sparsity=0.3,
            final_sparsity=0.7,
            begin_step=0,
            end_step=599,
            power=2.5,
            frequency=1,
        ),
    ),
    ("ConstantSparsity", dict(target_sparsity=0.8, begin_step=3, frequency=7)),
]


@pytest.mark.parametrize("name, arguments", _SCHEDULES)
@pytest.mark.parametrize("mode", ["eager", "graph", "jit"])
def test_schedules_equal_tfmots_over_many_steps(name, arguments, mode):
    ours = getattr(pruning, name)(**arguments)
    theirs = getattr(sparsity_api, name)(**arguments)
    steps = tf.range(0, 700, dtype=tf.int64)

    def evaluate(schedule):
        call = schedule.__call__
        if mode != "eager":
            call = tf.function(call, jit_compile=mode == "jit")
        return [t.numpy() for t in call(steps)]

    for a, b in zip(evaluate(ours), evaluate(theirs)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_benchmark_schedule_equals_tfmots_step_by_step(jit_compile):
    arguments = _SCHEDULES[0][1]
    steps = range(0, 420)
    for a, b in zip(
        pruning.schedule_table(
            pruning.PolynomialDecay(**arguments), steps, jit_compile
        ),
        pruning.schedule_table(
            sparsity_api.PolynomialDecay(**arguments), steps, jit_compile
        ),
    ):
        np.testing.assert_array_equal(a, b)


class _Sparsity:
    """A schedule whose sparsity is a variable: one trace for many sparsities."""

    def __init__(self):
        self.value = tf.Variable(0.0)

    def __call__(self, step):
        return tf.constant(True), self.value.read_value()


def _mask_functions(shape, block_size=(1, 1), pooling="AVG", m_by_n=None):
    """`(ours, tfmot)`: each maps (weights, sparsity) to the mask, traced once."""
    weights = tf.Variable(tf.zeros(shape))
    schedule = _Sparsity()
    impl = pruning_impl.Pruning(
        training_step_fn=lambda: tf.constant(1, tf.int64),
        pruning_vars=[(weights, tf.Variable(tf.ones(shape)), tf.Variable(0.0))],
        pruning_schedule=schedule,
        block_size=block_size,
        block_pooling_type=pooling,
        sparsity_m_by_n=m_by_n,
    )
    # TF-MOT's `Pruning._maybe_update_block_mask`: the mask it assigns.
    tfmot_mask = tf.function(lambda: impl._maybe_update_block_mask(weights)[1])
    ours_mask = tf.function(
        lambda: pruning.magnitude_mask(
            weights, schedule.value, block_size, m_by_n, block_pooling_type=pooling
        )
    )

    def both(values, sparsity):
        weights.assign(values)
        schedule.value.assign(sparsity)
        return ours_mask().numpy(), tfmot_mask().numpy()

    return both


def _weights(shape, seed, ties):
    values = np.random.RandomState(seed).randn(*shape).astype(np.float32)
    return np.round(values * 2) / 2 if ties else values


# Around 2/3 maskfit switches from TF-MOT's full sort to a partial one.
_SPARSITIES = (0.0, 0.3, 0.5, 0.6, 0.66, 0.67, 0.7, 0.9, 0.999)


@pytest.mark.parametrize("shape", [(64, 30), (7, 5), (3, 3, 8, 16), (10,)])
def test_unstructured_masks_equal_tfmots(shape):
    both = _mask_functions(shape)
    for seed, sparsity in enumerate(_SPARSITIES):
        for ties in (False, True):
            ours, theirs = both(_weights(shape, seed, ties), sparsity)
            np.testing.assert_array_equal(ours, theirs)


_many_ties = _mask_functions((40, 25))


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    levels=st.integers(1, 50),
    sparsity=st.integers(0, 999).map(lambda n: n / 1000),
)
def test_masks_equal_tfmots_whatever_the_ties_and_the_sparsity(seed, levels, sparsity):
    # Few magnitude levels: many entries tie with the threshold, on either
    # side of the sort's cut-off.
    rng = np.random.RandomState(seed)
    values = rng.randint(0, levels, (40, 25)) * rng.choice([-1, 1], (40, 25))
    ours, theirs = _many_ties(values.astype(np.float32) / levels, sparsity)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(
    "shape, block_size",
    [
        ((64, 30), (2, 2)),
        ((33, 17), (4, 4)),  # "SAME" pads 3 (1 before) on both axes: shifted windows.
        ((6, 10), (4, 1)),
        ((8, 8), (3, 2)),
    ],
)
@pytest.mark.parametrize("pooling", ["AVG", "MAX"])
def test_block_masks_equal_tfmots_including_the_padding_shift(
    shape, block_size, pooling
):
    both = _mask_functions(shape, block_size, pooling)
    for seed, sparsity in enumerate((0.3, 0.5, 0.9)):
        ours, theirs = both(_weights(shape, seed, ties=False), sparsity)
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(
    "shape, m_by_n",
    [
        ((64, 30), (2, 4)),
        ((7, 5), (2, 4)),
        ((3, 3, 8, 16), (2, 4)),
        ((3, 3, 7, 5), (2, 4)),
        ((3, 3, 7, 5), (1, 3)),
    ],
)
def test_m_by_n_masks_equal_tfmots(shape, m_by_n):
    both = _mask_functions(shape, m_by_n=m_by_n)
    for seed, ties in enumerate((False, True)):
        ours, theirs = both(_weights(shape, seed, ties), 0.5)
        np.testing.assert_array_equal(ours, theirs)


def test_registry_agrees_with_tfmots_on_the_classes_both_know():
    tfmot_map = {
        cls.__name__: names
        for cls, names in prune_registry.PruneRegistry._LAYERS_WEIGHTS_MAP.items()
    }
    cells = {
        cls.__name__: names
        for cls, names in prune_registry.PruneRegistry._RNN_CELLS_WEIGHTS_MAP.items()
    }
    compared = 0
    for name, names in {**tfmot_map, **cells}.items():
        ours_class = getattr(keras.layers, name, None)
        if ours_class is None or name == "MultiHeadAttention":
            continue
        entry = pruning.classify(ours_class)
        if names:
            assert (entry.kind, entry.weights) == ("prunable", tuple(names)), name
        else:
            assert entry.kind == "none", name
        compared += 1
    assert compared > 50

    attention = keras.layers.MultiHeadAttention(2, 4)
    attention.build((None, 3, 5), (None, 3, 5))
    owners = [owner for owner, _ in pruning.prunable_layers(attention)]
    assert owners == [
        attention.query_dense,
        attention.key_dense,
        attention.value_dense,
        attention.output_dense,
    ]
    assert [w for _, ws in pruning.prunable_layers(attention) for w in ws] == [
        o.kernel for o in owners
    ]
