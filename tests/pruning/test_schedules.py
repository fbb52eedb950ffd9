"""Pruning schedules: TF-MOT's step semantics, step by step, in eager, graph and jit."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from maskfit import pruning
from tests.helpers import tf_modes

# float32 sparsities against the float64 formula: a few ulps of values <= 1.
_ATOL = 1e-6


def _formula(step, initial, final, begin, end, power, frequency):
    """TF-MOT's PolynomialDecay, written out in float64: (should_prune, sparsity)."""
    in_range = begin <= step and (step <= end or end < 0)
    should_prune = in_range and (step - begin) % frequency == 0
    p = min(1.0, max(0.0, (step - begin) / (end - begin)))
    return should_prune, final + (initial - final) * (1.0 - p) ** power


def _evaluate(schedule, steps, mode):
    if mode == "eager":
        outputs = [schedule(tf.constant(s, tf.int64)) for s in steps]
        return (
            np.array([bool(p) for p, _ in outputs]),
            np.array([float(v) for _, v in outputs], np.float32),
        )
    return pruning.schedule_table(schedule, steps, jit_compile=mode == "jit")


_fresh_keras = tf_modes._fresh_keras
mode_name = tf_modes.mode_name


# TF-MOT's own example schedule (test_tfmot_parity.py runs it against TF-MOT).
TFMOT_EXAMPLE = dict(
    initial_sparsity=0.0, final_sparsity=0.9, begin_step=0, end_step=400, frequency=20
)


@pytest.mark.parametrize(
    "arguments",
    [
        TFMOT_EXAMPLE,
        dict(
            initial_sparsity=0.2,
            final_sparsity=0.8,
            begin_step=7,
            end_step=130,
            power=2,
            frequency=9,
        ),
        dict(
            initial_sparsity=0.5,
            final_sparsity=0.1,
            begin_step=3,
            end_step=50,
            power=1.5,
            frequency=1,
        ),
    ],
)
def test_polynomial_decay_follows_tfmot_formula_step_by_step(arguments, mode_name):
    schedule = pruning.PolynomialDecay(**arguments)
    steps = list(range(0, arguments["end_step"] + 30))
    should_prune, sparsity = _evaluate(schedule, steps, mode_name)

    expected = [
        _formula(
            s,
            arguments["initial_sparsity"],
            arguments["final_sparsity"],
            arguments["begin_step"],
            arguments["end_step"],
            arguments.get("power", 3),
            arguments["frequency"],
        )
        for s in steps
    ]
    np.testing.assert_array_equal(should_prune, [e[0] for e in expected])
    np.testing.assert_allclose(sparsity, [e[1] for e in expected], rtol=0, atol=_ATOL)
    assert sparsity.dtype == np.float32


def test_benchmark_schedule_prunes_every_20_steps_up_to_400():
    schedule = pruning.PolynomialDecay(
        0.0, 0.9, begin_step=0, end_step=400, frequency=20
    )

    points = pruning.pruning_steps(schedule, 0, 700)

    assert [step for step, _ in points] == list(range(0, 401, 20))
    assert points[0][1] == 0.0
    assert points[-1][1] == pytest.approx(0.9, abs=_ATOL)
    # Sparsity rises, fast and then slowly.
    gaps = np.diff([s for _, s in points])
    assert np.all(gaps > 0) and np.all(np.diff(gaps) < 0)


@pytest.mark.parametrize(
    "arguments, expected_steps",
    [
        (dict(target_sparsity=0.5, begin_step=0, frequency=10), list(range(0, 60, 10))),
        (
            dict(target_sparsity=0.5, begin_step=5, end_step=25, frequency=10),
            [5, 15, 25],
        ),
        (dict(target_sparsity=0.5, begin_step=7, end_step=7, frequency=3), [7]),
        (dict(target_sparsity=0.0, begin_step=0, end_step=-1, frequency=100), [0]),
    ],
)
def test_constant_sparsity_prunes_at_its_steps(arguments, expected_steps, mode_name):
    schedule = pruning.ConstantSparsity(**arguments)
    steps = list(range(0, 60))

    should_prune, sparsity = _evaluate(schedule, steps, mode_name)

    assert np.flatnonzero(should_prune).tolist() == expected_steps
    np.testing.assert_array_equal(
        sparsity, np.full(len(steps), arguments["target_sparsity"], np.float32)
    )


def test_schedule_reads_a_step_variable_inside_a_compiled_step_without_retracing():
    schedule = pruning.PolynomialDecay(0.0, 0.8, begin_step=2, end_step=12, frequency=2)
    step = tf.Variable(0, dtype=tf.int64)
    traces = []

    @tf.function(jit_compile=True)
    def compiled_step():
        traces.append(1)
        should_prune, sparsity = schedule(step.read_value())
        step.assign_add(1)
        return should_prune, sparsity

    seen = [compiled_step() for _ in range(16)]

    assert len(traces) == 1
    pruned_at = [i for i, (p, _) in enumerate(seen) if bool(p)]
    assert pruned_at == [2, 4, 6, 8, 10, 12]
    assert float(seen[12][1]) == pytest.approx(0.8, abs=_ATOL)


def test_schedule_accepts_int32_steps_and_refuses_float_steps():
    schedule = pruning.ConstantSparsity(0.5, 0, frequency=2)
    should_prune, _ = schedule(tf.constant(4, tf.int32))
    assert bool(should_prune)
    with pytest.raises(TypeError, match="integer training step"):
        schedule(tf.constant(4.0))


@pytest.mark.parametrize(
    "make, error, message",
    [
        (
            lambda: pruning.ConstantSparsity(1.0, 0),
            ValueError,
            "target_sparsity must be",
        ),
        (lambda: pruning.ConstantSparsity(-0.1, 0), ValueError, r"\[0, 1\)"),
        (
            lambda: pruning.ConstantSparsity(0.5, -1),
            ValueError,
            "begin_step must be >= 0",
        ),
        (
            lambda: pruning.ConstantSparsity(0.5, 10, 5),
            ValueError,
            "begin_step must be <=",
        ),
        (
            lambda: pruning.ConstantSparsity(0.5, 0, -2),
            ValueError,
            "end_step must be -1",
        ),
        (
            lambda: pruning.ConstantSparsity(0.5, 0, frequency=0),
            ValueError,
            "frequency",
        ),
        (
            lambda: pruning.ConstantSparsity(0.5, 1.5),
            TypeError,
            "begin_step must be an integer",
        ),
        (lambda: pruning.ConstantSparsity("0.5", 0), ValueError, "target_sparsity"),
        (lambda: pruning.ConstantSparsity(True, 0), ValueError, "target_sparsity"),
        (lambda: pruning.PolynomialDecay(0.0, 0.9, 0, -1), ValueError, "cannot be -1"),
        (
            lambda: pruning.PolynomialDecay(0.0, 0.9, 5, 5),
            ValueError,
            "end_step must be >",
        ),
        (
            lambda: pruning.PolynomialDecay(0.0, 1.0, 0, 10),
            ValueError,
            "final_sparsity",
        ),
        (
            lambda: pruning.PolynomialDecay(1.2, 0.5, 0, 10),
            ValueError,
            "initial_sparsity",
        ),
        (
            lambda: pruning.PolynomialDecay(0.0, 0.5, 0, 10, power=0),
            ValueError,
            "power",
        ),
        (
            lambda: pruning.PolynomialDecay(0.0, 0.5, 0, 10, frequency=-3),
            ValueError,
            "frequency",
        ),
    ],
)
def test_bad_arguments_raise_at_construction(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize(
    "schedule",
    [
        pruning.PolynomialDecay(0.1, 0.9, 3, 300, power=2, frequency=7),
        pruning.ConstantSparsity(0.75, 10, 100, 5),
    ],
)
def test_schedules_serialize_with_keras_and_from_tfmot_configs(schedule):
    config = keras.saving.serialize_keras_object(schedule)
    assert config["registered_name"] == f"maskfit>{type(schedule).__name__}"

    restored = keras.saving.deserialize_keras_object(config)
    nested = type(schedule).from_config(
        {"class_name": type(schedule).__name__, "config": schedule.get_config()}
    )

    assert restored == schedule and nested == schedule
    np.testing.assert_array_equal(
        pruning.schedule_table(restored, range(0, 120))[1],
        pruning.schedule_table(schedule, range(0, 120))[1],
    )


def test_custom_schedule_uses_tfmot_helpers_in_a_compiled_step():
    class EveryOther(pruning.PruningSchedule):
        """Prunes at even steps from 4 to 10, the sparsity rising by 0.1 each time."""

        def __init__(self):
            self._validate_step(4, 10, 2, allow_negative_1=False)

        def __call__(self, step):
            should_prune = self._should_prune_in_step(step, 4, 10, 2)
            return should_prune, tf.cast(step, tf.float32) / 20.0

        def get_config(self):
            return {}

    points = pruning.pruning_steps(EveryOther(), 0, 20, jit_compile=True)

    assert [s for s, _ in points] == [4, 6, 8, 10]
    np.testing.assert_allclose([v for _, v in points], [0.2, 0.3, 0.4, 0.5], atol=_ATOL)


def test_base_class_is_abstract():
    with pytest.raises(TypeError):
        pruning.PruningSchedule()
