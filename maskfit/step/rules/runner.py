"""`RuleRunner`: runs a step's rules where they belong, and the state they need.

A step runs a rule in one of three places: before the forward pass
(`before_forward`, most rules), right after the update (`after_update`, rules
that read the step's gradients), or outside the step, before a call
(`prepare`, a rule whose only update left is that call's first step). Rules
that observe gradients see them in between (`observe`). The runner keeps the
rules' `RuleKeeps` and the fresh optimizer state regrowing rules give the
entries they keep again (read outside the step). `GradientMasker` owns one.
"""

import contextlib

import tensorflow as tf

from maskfit import internals
from maskfit.optim import traits
from maskfit.paths import handle
from maskfit.step.rules import keeps as keeps_lib
from maskfit.step.rules import update as update_lib

__all__ = ["RuleRunner"]


class RuleRunner:
    """The rules of one training step, and where they run.

    Args:
      variables: the step's variables, in its order.

    Attributes:
      keeps: the `RuleKeeps` (keep masks; which rules the step runs).
    """

    def __init__(self, variables):
        self._variables = variables
        self.keeps = keeps_lib.RuleKeeps()
        self._fresh = {}  # {position: [(state, fresh value)]} of regrowing rules
        self._left_out = False  # `updates_left_out`, while a step is traced

    def read_fresh_state(self, optimizer):
        """Reads, outside the step, the fresh optimizer state of every variable a
        regrowing rule covers (`optim.traits.fresh_state`), for the step to use.

        Call it whenever the optimizer was (re)built. A step planned inside
        its own first trace has none until then: an entry grown back in that
        first call keeps the state it has (fresh, unless it learned and was
        dropped within that call).
        """
        regrowing = self.keeps.regrowing_indices(range(len(self.keeps.groups)))
        self._fresh = {
            i: traits.fresh_state(optimizer, self._variables[i])
            for i in sorted(regrowing)
        }

    def due(self, step):
        """Whether a rule the step runs updates at optimizer `step`: a bool tensor.

        None when the step runs no rule (`maskfit.step.split` reads it).
        """
        numbers = sorted(self.keeps.in_step)
        if not numbers:
            return None
        step = tf.cast(tf.convert_to_tensor(step), tf.int64)
        due = [self.keeps.groups[n].rule.should_update(step) for n in numbers]
        return tf.reduce_any(tf.stack([tf.convert_to_tensor(d, tf.bool) for d in due]))

    @contextlib.contextmanager
    def updates_left_out(self):
        """A step traced in here runs no rule's update (`before_forward` and
        `after_update` do nothing); the keep masks still apply, and rules
        still `observe` gradients. For steps at which no rule updates
        (`maskfit.step.split`)."""
        self._left_out = True
        try:
            yield
        finally:
            self._left_out = False

    def prepare(self, view, settle, xla=False):
        """Outside the step, before a call that starts at optimizer `view.step`.

        Applies each rule that the step leaves out and whose last update is
        that step; with `settle` (a newly traced step), also sets every
        dropped entry to +0.0, weights and (unless the step is compiled with
        XLA, which relies on no state: `RuleKeeps.zeroed`) the state the
        optimizer keeps for them (`RuleKeeps.settle`). Returns False, doing
        nothing, when a rule left out of the step may still update after
        that step (the optimizer went back, e.g. to an earlier backup): the
        step must be planned again.

        Args:
          view: the `StepView` of the call's first step, made eagerly (its
            `step` an int).
          settle: whether the step was traced anew.
          xla: whether the step is compiled with XLA (`jit_compile=True`).
        """
        keeps = self.keeps
        applied = keeps.due_at(view.step)
        if applied is None:
            return False
        if not (applied or settle):
            return True
        variables = self._variables
        state = {}
        if not xla:
            state = traits.zeroable_state(view.optimizer, variables, keeps.by_index)
        if applied:
            fresh = {
                i: traits.fresh_state(view.optimizer, variables[i])
                for i in keeps.regrowing_indices(applied)
            }
            update_lib.apply(keeps, view, update_lib.RuleRun(applied, state, fresh))
        if settle:
            handles = [handle(v) for v in variables]
            keeps.settle(handles, view.left_out, state)
        return True

    def before_forward(self, view):
        """In the step, before the forward pass: the rules that do not read gradients.

        A rule that updates in this step gets new keep masks, and the weights
        it drops are set to +0.0; where the optimizer keeps such entries at 0
        by itself, so is their state in it (not under XLA, where the zeroing
        after the update fuses in).
        """
        self._run(view, self.keeps.in_step_where(False))

    def observe(self, view, gradients):
        """Gives each rule that `observes_gradients` its variables' gradients.

        Right after the gradients are computed, before they are masked.
        """
        for group in self.keeps.groups:
            if not group.rule.observes_gradients:
                continue
            pairs = [
                (handle(self._variables[i]), gradients[i])
                for i in group.indices
                if gradients[i] is not None and i not in view.left_out
            ]
            if pairs:
                group.rule.observe_gradients(
                    view.step, [v for v, _ in pairs], [g for _, g in pairs]
                )

    def after_update(self, view, gradients):
        """After the update: the rules that read the step's gradients.

        Each rule that `uses_gradients` and updates at `view.step` (the
        optimizer step the update just ran) gets new keep masks from the
        weights and the step's gradients: the entries it drops are set to
        +0.0, the ones it grows start at 0 with a fresh optimizer's state, so
        only entries kept before and after learn in an update step. A step
        whose gradients are not finite (a loss-scale overflow: the optimizer
        skipped it) skips the rules' update too.
        """
        self._run(view, self.keeps.in_step_where(True), gradients)

    def _run(self, view, numbers, gradients=None):
        """Runs the rules at `numbers` (in the step's groups) that update now."""
        if not numbers or self._left_out:
            return
        keeps = self.keeps
        zeroed = set() if internals.tracing_for_xla() else keeps.indices_in_step()
        regrowing = keeps.regrowing_indices(numbers)
        run = update_lib.RuleRun(
            only=numbers,
            zeroed_state=traits.zeroable_state(view.optimizer, self._variables, zeroed),
            fresh={i: f for i, f in self._fresh.items() if i in regrowing},
            gradients=gradients,
        )
        update_lib.apply(keeps, view, run)
