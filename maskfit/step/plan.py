"""What a compiled step does for each masked variable, over the steps it will run.

Masks are state, but some of what they imply shapes the compiled step itself:
a variable whose mask is all 0 gets no gradient, no optimizer slots and no
snapshot (it costs what `trainable=False` costs); one whose mask is all 1 needs
no masking; only one with a 0 somewhere needs its frozen entries restored after
the update. A `StepPlan` fixes these choices for a range of optimizer steps,
from the masks' schedules, read on the host:

- `left_out`: variables whose mask is all 0 (frozen whole) at every step of
  the range the plan starts with; they are left out of the step.
- per remaining masked variable, whether its gradient is masked and whether its
  frozen entries are restored: `"never"`, `"always"`, or `"sometimes"` (decided
  in the step from the mask in force, so a schedule may change it).

A plan holds until the step at which a variable turns fully frozen or back
(`valid_until`, None if never); the step is then planned again, and traced
again only if the plan changed.
"""

import collections

import numpy as np

from maskfit.spec import schedule

__all__ = [
    "ALWAYS",
    "NEVER",
    "SOMETIMES",
    "StepPlan",
    "VariableNeeds",
    "needs_of",
    "plan_steps",
]

NEVER, ALWAYS, SOMETIMES = "never", "always", "sometimes"


class VariableNeeds(
    collections.namedtuple(
        "VariableNeeds", ["boundaries", "frozen", "masked", "guarded", "scaled"]
    )
):
    """One masked variable's needs in each interval of its mask's schedule.

    Attributes:
      boundaries: the steps at which the next interval starts.
      frozen, masked, guarded, scaled: one bool per interval: the mask is
        all 0; it has an entry other than 1; it has a 0 (frozen entries to
        restore); it has an entry other than 0 and 1 that scales the
        learning rate (`scale="step"`).
    """

    @classmethod
    def from_masks(cls, boundaries, masks, has_shared=False, scales_steps=False):
        """Needs from the masks of each interval (arrays that broadcast to the variable).

        `scales_steps`: whether values other than 0 and 1 scale the learning
        rate (`scale="step"`), rather than the gradient.
        """
        frozen, masked, guarded, scaled = [], [], [], []
        for mask in masks:
            mask = np.asarray(mask)
            zero = mask == 0
            frozen.append(bool(np.all(zero)) and not has_shared)
            masked.append(bool(np.any(mask != 1)))
            guarded.append(bool(np.any(zero)))
            scaled.append(scales_steps and bool(np.any(~zero & (mask != 1))))
        return cls(
            tuple(boundaries),
            tuple(frozen),
            tuple(masked),
            tuple(guarded),
            tuple(scaled),
        )

    @classmethod
    def ruled(cls, needs=None):
        """The needs of a variable whose mask a rule also changes in the step.

        A rule (`maskfit.mask_rules`) may drop entries at any step, in the
        graph: the variable is masked and guarded at every step. It is left
        out of the step only where `needs` (those of its declared mask, if
        any) freeze it whole, which no rule can undo.
        """
        if needs is None:
            return cls((), (False,), (True,), (True,), (False,))
        always = (True,) * len(needs.frozen)
        return needs._replace(masked=always, guarded=always)

    def interval(self, step):
        """The interval that optimizer step `step` is in."""
        return schedule.interval_at(self.boundaries, step)

    def intervals(self, start, stop=None):
        """The intervals that steps `start` to `stop` (None: on and on) touch."""
        last = len(self.frozen) - 1 if stop is None else self.interval(stop)
        return range(self.interval(start), last + 1)


def _mode(flags):
    if all(flags):
        return ALWAYS
    return SOMETIMES if any(flags) else NEVER


class StepPlan(
    collections.namedtuple(
        "StepPlan", ["left_out", "masked", "guarded", "scaled", "valid_until"]
    )
):
    """The compiled step's choices for a range of steps.

    Attributes:
      left_out: frozenset of variable positions left out of the step.
      masked, guarded, scaled: dicts from the position of each other masked
        variable to `NEVER`, `ALWAYS` or `SOMETIMES` (whether its gradient is
        masked, its frozen entries restored, its learning rate multiplied).
      valid_until: the first step the plan does not cover, or None.
    """

    @property
    def frozen(self):
        """`left_out`, by its 0.1 name (`benchmarks.harness` reads it)."""
        return self.left_out

    def covers(self, other):
        """Whether a step traced for this plan can run the steps `other` plans.

        The left-out sets must agree; a choice of `ALWAYS` or `SOMETIMES` covers
        any need (the mask decides), `NEVER` covers only `NEVER`.
        """
        if self.left_out != other.left_out or set(self.masked) != set(other.masked):
            return False
        pairs = (
            (self.masked, other.masked),
            (self.guarded, other.guarded),
            (self.scaled, other.scaled),
        )
        return all(
            mine[i] != NEVER or theirs[i] == NEVER
            for mine, theirs in pairs
            for i in mine
        )


def _keep_one(frozen, total):
    """`frozen`, less its first variable if it holds all `total` of them."""
    if frozen and total is not None and len(frozen) == total:
        return frozen - {min(frozen)}
    return frozen


def plan_steps(needs, start, span, total=None):
    """Plans the step for steps `start` to `start + span - 1` and on, while it holds.

    Args:
      needs: dict from variable position to its `VariableNeeds`.
      start: the optimizer step the plan starts at.
      span: how many steps a call of the compiled step may run
        (`steps_per_execution`); the left-out set is the variables frozen at
        every one of them.
      total: how many variables the step has (masked or not). If all would be
        frozen, the first stays in the step, masked and restored, so that the
        optimizer's step count (which schedules read) still advances.

    Returns:
      A `StepPlan`.
    """
    stop = start + max(int(span), 1) - 1
    frozen = frozenset(
        i
        for i, n in needs.items()
        if all(n.frozen[k] for k in n.intervals(start, stop))
    )
    left_out = _keep_one(frozen, total)
    # The plan ends where any variable turns fully frozen or back after its
    # first call: the step is then planned again (and, for a variable that
    # learns again, its optimizer slots start afresh).
    valid_until = None
    before = frozenset(i for i, n in needs.items() if n.frozen[n.interval(stop)])
    before = _keep_one(before, total)
    for boundary in sorted(
        {b for n in needs.values() for b in n.boundaries if b > stop}
    ):
        now = frozenset(i for i, n in needs.items() if n.frozen[n.interval(boundary)])
        now = _keep_one(now, total)
        if now != before:
            valid_until = boundary
            break
    end = None if valid_until is None else valid_until - 1
    masked, guarded, scaled = {}, {}, {}
    for i, n in needs.items():
        if i in left_out:
            continue
        touched = n.intervals(start, end)
        masked[i] = _mode([n.masked[k] or n.frozen[k] for k in touched])
        guarded[i] = _mode([n.guarded[k] for k in touched])
        scaled[i] = _mode([n.scaled[k] for k in touched])
    return StepPlan(left_out, masked, guarded, scaled, valid_until)


def needs_of(declared, i):
    """The `VariableNeeds` of the `i`-th variable a `DeclaredMask` covers."""
    steps = declared.scale == "step"
    if declared.layouts is None:
        return VariableNeeds.from_masks(
            declared.boundaries, declared.table, scales_steps=steps
        )
    layout = declared.layouts[i]
    return VariableNeeds.from_masks(
        declared.boundaries,
        [layout.expand_numpy(values) for values in declared.table],
        has_shared=layout.has_shared,
        scales_steps=steps,
    )
