"""benchmarks.resume_exactness, tiny and in one process (its kill and restart are
those of test_exact_resume.py)."""

import pytest

from benchmarks.resume_exactness import lib

TINY = dict(
    kills=3,
    save_freq=2,
    samples=8,
    batch=4,
    epochs=2,
    overhead_steps=4,
    overhead_repeats=1,
)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(contenders=("keras_steps", "nope")), "Unknown contenders"),
        (dict(kills=0), "kills=0"),
        (dict(save_freq=0), "save_freq=0"),
    ],
)
def test_bad_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lib.Config(**kwargs)


def test_kill_steps_are_distinct_steps_inside_the_run():
    config = lib.Config(**TINY)
    steps = lib.kill_steps(config)
    assert steps == lib.kill_steps(config)  # the same for every contender
    assert len(set(steps)) == 3 and all(1 <= s < config.steps for s in steps)
    assert config.steps == 4


def test_a_reference_child_writes_its_final_state(tmp_path):
    config = lib.Config(**TINY)
    lib.child(config, "reference", 0, str(tmp_path))
    final = lib._load(str(tmp_path))
    assert int(final["iterations"]) == config.steps
    assert lib.compare(final, final) == (True, 0.0, config.steps)


def test_overhead_and_table():
    config = lib.Config(**TINY)
    overhead = lib.step_overhead(config)
    assert set(overhead) == {"ms_per_step_none", "keras", "maskfit"}
    assert all(value > 0 for value in overhead.values())
    rows = [
        dict(
            contender="maskfit_steps",
            exact=3,
            kills=3,
            median_max_abs_difference=0.0,
            runs=[dict(steps_trained=4)] * 3,
        ),
    ]
    table = lib.format_table(rows, config, overhead).splitlines()
    assert table[2] == "| maskfit_steps | 3 of 3 | 0 | 4 |"
    assert "maskfit's" in table[-1]
