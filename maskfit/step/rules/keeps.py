"""`RuleKeeps`: the keep masks of a step's rules, and which rules the step runs.

`maskfit.spec.rules` declares rules on layers and resolves them against a
step's variables (`RuleGroup`s); `RuleKeeps` holds one keep mask per covered
variable as state (made, loaded, settled outside the step) and says which
rules a step traced at a given optimizer step must run (`in_step_from`,
`due_at`). `maskfit.step.rules.runner.RuleRunner` runs the rules with it.
"""

import numpy as np
import tensorflow as tf

from maskfit import internals
from maskfit.optim import traits
from maskfit.spec import rules
from maskfit.step import mask_state
from maskfit.step.rules import update as update_lib

__all__ = ["RuleKeeps"]


class RuleKeeps:
    """The keep masks of one training step's rules, and which rules it runs.

    Attributes:
      by_index: `{variable position: keep mask}`, bool `tf.Variable`s of the
        variables' shapes, made outside the step and kept while a rule covers
        the variable.
      groups: the `RuleGroup`s the step applies.
      in_step: positions in `groups` of the rules the traced step runs (the
        others are applied by `prepare`, outside it).
    """

    def __init__(self):
        self.by_index = {}
        self.groups = ()
        self.in_step = frozenset()

    def update(self, groups, variables, frozen=None):
        """Makes a keep mask per covered variable, keeping existing ones; True to retrace.

        The step traces each rule's code, so a rule object that changes (or a
        variable that gains or loses one) needs a retrace; new keep values do
        not. A rule's new keep masks start from its `initial_keep_masks`.

        Args:
          groups: the `RuleGroup`s of the step.
          variables: the step's variables, in its order.
          frozen: `{position: bool array}`, where declared masks freeze
            entries (kept by every initial mask); none by default.
        """
        frozen = frozen or {}
        keeps, made = {}, set()
        for index in sorted(i for group in groups for i in group.indices):
            keep = self.by_index.get(index)
            if keep is None:
                variable = variables[index]
                keep = tf.Variable(
                    tf.ones(variable.shape, tf.bool),
                    trainable=False,
                    name="keep_" + variable.path.replace("/", "_"),
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                )
                made.add(index)
            keeps[index] = keep
        for group in groups:
            if made.issuperset(group.indices):
                update_lib.start(group, keeps, variables, frozen)

        def signature(gs):
            return [(id(g.rule), g.indices) for g in gs]

        retrace = set(keeps) != set(self.by_index) or signature(groups) != signature(
            self.groups
        )
        self.by_index, self.groups = keeps, tuple(groups)
        return retrace

    def in_step_from(self, step, prepared):
        """Positions in `groups` of the rules a step traced at optimizer `step` runs.

        Those that may update after `step`, or at it unless `prepared` (the
        caller applies those due at the first step of a call before it, with
        `due_at`; never a rule that `uses_gradients`, which only the step has).
        A rule without a bound (`last_update_step()` None) always.
        """
        found = set()
        for number, group in enumerate(self.groups):
            last = rules.last_update_of(group)
            at_call = not prepared or group.rule.uses_gradients
            if last is None or last > step or (last == step and at_call):
                found.add(number)
        return frozenset(found)

    def due_at(self, step):
        """The rules outside the step (not in `in_step`) that update at `step`.

        Returns their positions in `groups`, or None when one of them may
        update after `step` (the optimizer went back): the step must then be
        traced with it.
        """
        due = set()
        for number, group in enumerate(self.groups):
            if number in self.in_step:
                continue
            last = rules.last_update_of(group)
            if last is None or last > step:
                return None
            if last == step:
                due.add(number)
        return due

    @property
    def left_out(self):
        """Whether a rule is left out of the step (applied by `prepare`)."""
        return len(self.in_step) < len(self.groups)

    def indices_in_step(self):
        """Positions of the variables whose rule the step runs."""
        return {i for number in self.in_step for i in self.groups[number].indices}

    def in_step_where(self, uses_gradients):
        """The rules of `in_step` that run before the forward pass (False) or after
        the gradients (True)."""
        return frozenset(
            n
            for n in self.in_step
            if self.groups[n].rule.uses_gradients == uses_gradients
        )

    def regrowing_indices(self, numbers):
        """Positions of the variables whose rule (at `numbers`) regrows entries."""
        return {
            i
            for n in numbers
            if self.groups[n].rule.regrows
            for i in self.groups[n].indices
        }

    def zeroed(self, optimizer, variables):
        """Positions whose dropped entries' optimizer state is 0 and stays 0 by itself.

        Those of the optimizers of `optim.traits.keeps_dropped_entries_at_zero`,
        outside XLA. A step compiled with XLA relies on no state: it zeroes
        dropped entries after each update, which fuses into the update, and
        leaves their state as it is (state written in a rule's conditional
        would be one more operand of the update in every step), so a run that
        resumes under XLA, whose step is traced anew, holds the same state as
        one that never stopped.
        """
        if internals.tracing_for_xla():
            return set()
        return {
            i
            for i in self.by_index
            if traits.keeps_dropped_entries_at_zero(optimizer, variables[i])
        }

    def load(self, values):
        """Assigns keep masks `{position: bool array}`; returns those it has none for."""
        rest = {}
        for index, value in values.items():
            keep = self.by_index.get(index)
            if keep is None or tuple(keep.shape) != np.shape(value):
                rest[index] = value
            else:
                keep.assign(np.asarray(value, bool))
        return rest

    def settle(self, variables, left_out, state):
        """Sets every dropped entry to +0.0, in the weights and in `state` (eagerly).

        Outside the step, before the first call of a newly traced one: a
        step that relies on the optimizer keeping dropped entries at 0
        (`maskfit.dropped_entries`) needs their state 0, whatever ran before
        (a step under XLA, which zeroes after each update instead, or weights
        set by hand).

        Args:
          variables: the step's `tf.Variable`s, in its order.
          left_out: positions left out of the step.
          state: `{position: [variables of its shape]}`, the optimizer state
            zeroed with the weights (`maskfit.optim.traits.zeroable_state`).
        """
        for index, keep in self.by_index.items():
            if index in left_out:
                continue
            for target in (variables[index],) + tuple(state.get(index, ())):
                target.assign(mask_state.where_masked(target, keep))
