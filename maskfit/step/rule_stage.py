"""`RuleStage`: where in a step the rules run, and the optimizer state they need.

A step runs a rule in one of three places: before the forward pass
(`before_forward`, most rules), right after the update (`after_update`, rules
that read the step's gradients), or outside the step, before a call
(`prepare`, a rule whose only update left is that call's first step). Rules
that observe gradients see them in between (`observe`). The stage keeps the
rules' `RuleState` and the fresh optimizer state regrowing rules give the
entries they keep again (read outside the step). `GradientMasker` owns one.
"""

import contextlib

import tensorflow as tf

from maskfit import internals
from maskfit.optim import traits
from maskfit.paths import handle
from maskfit.step import rule_state, rule_update

__all__ = ["RuleStage"]


class RuleStage:
    """The rules of one training step, and where they run.

    Args:
      variables: the step's variables, in its order.

    Attributes:
      state: the `RuleState` (keep masks; which rules the step runs).
    """

    def __init__(self, variables):
        self._variables = variables
        self.state = rule_state.RuleState()
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
        regrowing = self.state.regrowing_indices(range(len(self.state.groups)))
        self._fresh = {
            i: traits.fresh_state(optimizer, self._variables[i])
            for i in sorted(regrowing)
        }

    def due(self, step):
        """Whether a rule the step runs updates at optimizer `step`: a bool tensor.

        None when the step runs no rule (`maskfit.step.split` reads it).
        """
        numbers = sorted(self.state.in_step)
        if not numbers:
            return None
        step = tf.cast(tf.convert_to_tensor(step), tf.int64)
        due = [self.state.groups[n].rule.should_update(step) for n in numbers]
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

    def prepare(self, step, optimizer, frozen, declared, settle, xla):
        """Outside the step, before a call at optimizer `step`: `RuleState.prepare`."""
        return self.state.prepare(
            step, optimizer, self._variables, frozen, declared, settle, xla
        )

    def before_forward(self, step, optimizer, frozen, declared):
        """In the step, before the forward pass: the rules that do not read gradients.

        A rule that updates in this step gets new keep masks, and the weights
        it drops are set to +0.0; where `optimizer` keeps such entries at 0 by
        itself, so is their state in it (not under XLA, where the zeroing
        after the update fuses in).
        """
        self._run(step, optimizer, frozen, declared, self.state.in_step_where(False))

    @property
    def observes(self):
        """Whether a rule sees the step's gradients (`observe`)."""
        return any(group.rule.observes_gradients for group in self.state.groups)

    @property
    def updates_after(self):
        """Whether a rule that reads gradients runs in the step (`after_update`)."""
        return bool(self.state.in_step_where(True))

    def observe(self, step, gradients, frozen):
        """Gives each rule that `observes_gradients` its variables' gradients.

        Right after the gradients are computed, before they are masked.
        """
        for group in self.state.groups:
            if not group.rule.observes_gradients:
                continue
            pairs = [
                (handle(self._variables[i]), gradients[i])
                for i in group.indices
                if gradients[i] is not None and i not in frozen
            ]
            if pairs:
                group.rule.observe_gradients(
                    step, [v for v, _ in pairs], [g for _, g in pairs]
                )

    def after_update(self, step, optimizer, frozen, declared, gradients):
        """After the update: the rules that read the step's gradients.

        Each rule that `uses_gradients` and updates at `step` (the optimizer
        step the update just ran) gets new keep masks from the weights and
        the step's gradients: the entries it drops are set to +0.0, the ones
        it grows start at 0 with a fresh optimizer's state, so only entries
        kept before and after learn in an update step. A step whose gradients
        are not finite (a loss-scale overflow: the optimizer skipped it)
        skips the rules' update too.
        """
        numbers = self.state.in_step_where(True)
        self._run(step, optimizer, frozen, declared, numbers, gradients)

    def _run(self, step, optimizer, frozen, declared, numbers, gradients=None):
        """Runs the rules at `numbers` (in the step's groups) that update at `step`."""
        if not numbers or self._left_out:
            return
        state = self.state
        zeroed = set() if internals.tracing_for_xla() else state.indices_in_step()
        regrowing = state.regrowing_indices(numbers)
        rule_update.apply(
            state,
            step,
            [handle(v) for v in self._variables],
            frozen,
            declared,
            traits.zeroable_state(optimizer, self._variables, zeroed),
            only=numbers,
            gradients=gradients,
            fresh={i: f for i, f in self._fresh.items() if i in regrowing},
        )
