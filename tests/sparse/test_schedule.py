"""RigL's update schedule: which optimizer steps update, the drop fraction, errors."""

import math

import numpy as np
import pytest
import tensorflow as tf

from maskfit import sparse


@pytest.fixture(autouse=True)
def _fresh_keras():
    """Overrides conftest's: these tests make no Keras state."""
    yield


@pytest.fixture(params=["eager", "graph", "jit"])
def traced(request):
    """Runs a function of the step eagerly, in a tf.function, or XLA-compiled."""

    def wrap(fn):
        if request.param == "eager":
            return fn
        return tf.function(fn, jit_compile=request.param == "jit")

    return wrap


def _along(schedule, traced, steps):
    """`should_update` and `drop_fraction` for every optimizer step of `steps`."""
    fn = traced(lambda s: (schedule.should_update(s), schedule.drop_fraction(s)))
    update, fraction = fn(tf.constant(steps, tf.int64))
    return update.numpy(), fraction.numpy()


def test_cosine_updates_every_delta_t_until_t_end_with_rigls_fraction(traced):
    schedule = sparse.UpdateSchedule(delta_t=100, t_end=1000, alpha=0.3)
    steps = np.arange(0, 1500)
    update, fraction = _along(schedule, traced, steps)
    # Training step t = iterations + 1: t = 100, ..., 900 (at 1000 the cosine is 0).
    expected = [t - 1 for t in range(100, 1000, 100)]
    assert steps[update].tolist() == expected == schedule.update_steps()
    assert schedule.last_update_step() == 899
    t = steps[update] + 1
    np.testing.assert_allclose(
        fraction[update], 0.15 * (1 + np.cos(np.pi * t / 1000)), rtol=1e-6
    )
    assert np.all(fraction[~update] == 0)
    assert np.all(np.diff(fraction[update]) < 0)
    for step in expected:
        assert fraction[step] == np.float32(schedule.drop_fraction_at(step + 1))


def test_constant_updates_at_t_end_too(traced):
    schedule = sparse.UpdateSchedule(
        50, 200, alpha=0.2, drop_fraction_anneal="constant"
    )
    update, fraction = _along(schedule, traced, np.arange(0, 400))
    assert np.flatnonzero(update).tolist() == [49, 99, 149, 199]
    assert schedule.update_steps() == [49, 99, 149, 199]
    assert set(fraction[update].tolist()) == {np.float32(0.2)}


def test_begin_step_is_the_first_update_and_the_grid_starts_there(traced):
    schedule = sparse.UpdateSchedule(
        100, 450, begin_step=30, drop_fraction_anneal="constant"
    )
    update, _ = _along(schedule, traced, np.arange(0, 600))
    assert np.flatnonzero(update).tolist() == [29, 129, 229, 329, 429]
    assert schedule.update_steps() == [29, 129, 229, 329, 429]


def test_the_cosine_counts_from_step_0_as_in_the_paper():
    schedule = sparse.UpdateSchedule(100, 1000, alpha=0.4, begin_step=500)
    assert schedule.drop_fraction_at(500) == pytest.approx(0.2, abs=1e-7)
    assert schedule.drop_fraction_at(2000) == 0.0


def test_no_update_when_delta_t_passes_t_end():
    schedule = sparse.UpdateSchedule(delta_t=500, t_end=300)
    assert schedule.update_steps() == []
    assert schedule.last_update_step() is None
    assert not np.any(_along(schedule, lambda f: f, np.arange(0, 1000))[0])


def test_last_update_step_is_the_lists_last_and_computed_for_any_t_end():
    grids = ((100, 1000, 0), (50, 200, 0), (100, 450, 30), (7, 93, 5))
    for delta_t, t_end, begin_step in grids:
        for anneal in ("cosine", "constant"):
            schedule = sparse.UpdateSchedule(
                delta_t, t_end, begin_step=begin_step, drop_fraction_anneal=anneal
            )
            assert schedule.last_update_step() == schedule.update_steps()[-1]
    # t_end beyond any run (the step-time benchmark's): no list of 10**8 steps.
    schedule = sparse.UpdateSchedule(10, 10**9, drop_fraction_anneal="constant")
    assert schedule.last_update_step() == 10**9 - 1


def test_steps_beyond_int32_still_count():
    schedule = sparse.UpdateSchedule(100, 2**40, drop_fraction_anneal="constant")
    step = 10**10 - 1  # training step 10**10, on the grid
    assert bool(schedule.should_update(tf.constant(step, tf.int64)))
    assert not bool(schedule.should_update(tf.constant(step + 1, tf.int64)))


def test_config_round_trips_and_repr_names_the_arguments():
    schedule = sparse.UpdateSchedule(10, 90, 0.5, "constant", 5)
    assert sparse.UpdateSchedule(**schedule.get_config()).get_config() == (
        schedule.get_config()
    )
    assert repr(schedule) == (
        "UpdateSchedule(delta_t=10, t_end=90, alpha=0.5,"
        " drop_fraction_anneal='constant', begin_step=5)"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(delta_t=0), r"delta_t must be a positive integer.*Received: delta_t=0"),
        (dict(delta_t=2.5), r"Received: delta_t=2.5"),
        (dict(t_end=None), r"t_end must be a positive integer.*Received: t_end=None"),
        (dict(begin_step=-1), r"begin_step must be a non-negative"),
        (dict(begin_step=2000), r"begin_step must not be after t_end"),
        (
            dict(alpha=0.0),
            r"alpha .* must be a number in \(0, 1\].*Received: alpha=0.0",
        ),
        (dict(alpha=1.5), r"Received: alpha=1.5"),
        (dict(drop_fraction_anneal="exponential_3"), r"'cosine' or 'constant'"),
    ],
)
def test_bad_arguments_raise_one_clear_error(kwargs, message):
    arguments = dict(delta_t=100, t_end=1000)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sparse.UpdateSchedule(**arguments)


def test_fraction_formula_at_a_few_points():
    schedule = sparse.UpdateSchedule(100, 1000, alpha=0.3)
    for t, expected in [
        (0, 0.3),
        (500, 0.15),
        (1000, 0.0),
        (250, 0.15 * (1 + math.cos(math.pi / 4))),
    ]:
        assert schedule.drop_fraction_at(t) == pytest.approx(expected, abs=1e-7)
