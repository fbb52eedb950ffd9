"""Unit tests of `maskfit.step.plan`: what a compiled step does, planned on the host."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from maskfit.step import plan as plan_lib
from maskfit.step.plan import ALWAYS, NEVER, SOMETIMES, VariableNeeds, plan_steps


def needs(boundaries, *masks):
    return VariableNeeds.from_masks(boundaries, [np.asarray(m, float) for m in masks])


def test_needs_read_each_interval():
    n = needs((10,), [0, 0], [1, 0.5])
    assert n.frozen == (True, False)
    assert n.masked == (True, True)
    assert n.guarded == (True, False)
    assert (n.interval(9), n.interval(10)) == (0, 1)
    assert list(n.intervals(5, 12)) == [0, 1]
    assert list(n.intervals(12)) == [1]


def test_a_mask_of_zeros_with_shared_entries_is_not_frozen():
    n = VariableNeeds.from_masks((), [np.zeros(3)], has_shared=True)
    assert n.frozen == (False,) and n.guarded == (True,)


def test_a_ruled_variable_is_masked_and_guarded_always():
    assert VariableNeeds.ruled() == VariableNeeds(
        (), (False,), (True,), (True,), (False,)
    )
    declared = needs((4,), [0, 0], [1, 1])
    ruled = VariableNeeds.ruled(declared)
    assert ruled.frozen == declared.frozen
    assert ruled.masked == ruled.guarded == (True, True)


def test_plan_leaves_out_variables_frozen_over_the_whole_call():
    frozen_then_learning = needs((5,), [0], [1])
    always_half = needs((), [0.5])
    plan = plan_steps({0: frozen_then_learning, 1: always_half}, start=0, span=1)
    assert plan.left_out == {0}
    assert plan.valid_until == 5
    assert plan.masked == {1: ALWAYS} and plan.guarded == {1: NEVER}
    # A call of 6 steps reaches step 5, where variable 0 learns: it stays in.
    wide = plan_steps({0: frozen_then_learning, 1: always_half}, start=0, span=6)
    assert wide.left_out == frozenset()
    assert wide.masked[0] == wide.guarded[0] == SOMETIMES


def test_one_variable_stays_when_every_variable_would_be_frozen():
    plan = plan_steps({0: needs((), [0]), 1: needs((), [0])}, 0, 1, total=2)
    assert plan.left_out == {1}  # the first stays, so the optimizer's steps count on
    assert plan_steps({0: needs((), [0])}, 0, 1, total=2).left_out == {0}


def test_covers():
    sometimes = plan_steps({0: needs((3,), [1, 1], [0, 1])}, 0, 1)
    never = plan_steps({0: needs((), [1, 1])}, 0, 1)
    assert sometimes.guarded[0] == SOMETIMES and never.guarded[0] == NEVER
    assert sometimes.covers(never) and not never.covers(sometimes)
    frozen = plan_steps({0: needs((), [0]), 1: needs((), [1])}, 0, 1)
    assert not frozen.covers(never)


def test_needs_of_an_output_mask_expands_its_layout():
    from maskfit.step.declared import DeclaredMask
    from maskfit.units.layout import UnitLayout

    layout = UnitLayout(np.array([[0, 1, 2]]), 2)  # the third entry is shared
    declared = DeclaredMask(
        None, "output", (0,), np.array([[0.0, 0.0]]), (), False, (layout,), "step"
    )
    n = plan_lib.needs_of(declared, 0)
    assert n.frozen == (False,) and n.guarded == (True,)


_masks = st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=3)


@st.composite
def _schedules(draw):
    count = draw(st.integers(1, 3))
    boundaries = sorted(
        draw(st.sets(st.integers(1, 30), min_size=count - 1, max_size=count - 1))
    )
    masks = [draw(_masks) for _ in range(len(boundaries) + 1)]
    width = max(len(m) for m in masks)
    masks = [(m * width)[:width] for m in masks]
    return VariableNeeds.from_masks(tuple(boundaries), [np.asarray(m) for m in masks])


@settings(max_examples=200, deadline=None)
@given(
    schedules=st.lists(_schedules(), min_size=1, max_size=4),
    start=st.integers(0, 35),
    span=st.integers(1, 8),
)
def test_a_plan_holds_for_every_step_it_covers(schedules, start, span):
    all_needs = dict(enumerate(schedules))
    plan = plan_steps(all_needs, start, span)
    stop = start + span - 1
    for i, n in all_needs.items():
        frozen_every_step = all(n.frozen[n.interval(s)] for s in range(start, stop + 1))
        assert (i in plan.left_out) == frozen_every_step
    end = plan.valid_until if plan.valid_until is not None else 45
    assert end > stop
    for step in range(start, end):
        for i, n in all_needs.items():
            k = n.interval(step)
            if i in plan.left_out:
                assert n.frozen[k]  # left out only while frozen whole
                continue
            if n.masked[k] or n.frozen[k]:
                assert plan.masked[i] != NEVER
            if n.guarded[k]:
                assert plan.guarded[i] != NEVER
    if plan.valid_until is not None:
        before = {i for i, n in all_needs.items() if n.frozen[n.interval(stop)]}
        after = {
            i for i, n in all_needs.items() if n.frozen[n.interval(plan.valid_until)]
        }
        assert before != after
