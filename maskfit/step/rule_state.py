"""`RuleState`: the keep masks of a step's rules, and their update in the step.

`maskfit.spec.rules` declares rules on layers and resolves them against a
step's variables (`RuleGroup`s); a `RuleState` holds one keep mask per covered
variable as state and applies the rules: in the step (`apply`, traced once),
or eagerly just before a call (`apply(..., only=...)`, `settle`), and it says
which rules a step traced at a given optimizer step must run (`in_step_from`,
`due_at`). `maskfit.step.masker.GradientMasker` owns one.
"""

import keras
import numpy as np
import tensorflow as tf

from maskfit import internals
from maskfit import paths
from maskfit.optim import traits
from maskfit.spec import rules
from maskfit.step import mask_state

__all__ = ["RuleState"]


def _as_keep(mask):
    """`mask` (bool or 0/1 numbers) as a bool tensor."""
    mask = tf.convert_to_tensor(mask)
    return mask if mask.dtype == tf.bool else tf.not_equal(mask, 0)


class RuleState:
    """The rules of one training step: their keep masks, and their update in the step.

    Attributes:
      keeps: `{variable position: keep mask}`, bool `tf.Variable`s of the
        variables' shapes, made outside the step and kept while a rule covers
        the variable.
      groups: the `RuleGroup`s the step applies.
      in_step: positions in `groups` of the rules the traced step runs (the
        others are applied by `prepare`, outside it).
      prepared: whether `prepare` runs before each new call of the step.
    """

    def __init__(self):
        self.keeps = {}
        self.groups = ()
        self.in_step = frozenset()
        self.prepared = False

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
            keep = self.keeps.get(index)
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
                _start(group, keeps, variables, frozen)

        def signature(gs):
            return [(id(g.rule), g.indices) for g in gs]

        retrace = set(keeps) != set(self.keeps) or signature(groups) != signature(
            self.groups
        )
        self.keeps, self.groups = keeps, tuple(groups)
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
            n for n in self.in_step if self.groups[n].rule.uses_gradients == uses_gradients
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
        except, under XLA, for a rule the step runs: there the zeroing after the
        update fuses into it, while state written in the rule's conditional
        would be one more operand of it in every step. Without `prepared`, no
        settle ran either, so under XLA no rule's state is trusted.
        """
        ruled = self.indices_in_step() if self.prepared else set(self.keeps)
        xla = internals.tracing_for_xla()
        return {
            i
            for i in self.keeps
            if traits.keeps_dropped_entries_at_zero(optimizer, variables[i])
            and not (i in ruled and xla)
        }

    def prepare(self, step, optimizer, variables, frozen, declared, settle):
        """Outside the step, before a call that starts at optimizer `step`.

        Applies each rule that the step leaves out and whose last update is
        `step`; with `settle` (a newly traced step), also sets every dropped
        entry to +0.0, weights and the state `optimizer` keeps for them
        (`settle`). Returns False, doing nothing, when a rule left out of the
        step may still update after `step` (the optimizer went back, e.g. to
        an earlier backup): the step must be planned again.

        Args:
          step: the optimizer step the call starts at.
          optimizer: the step's optimizer.
          variables: the step's variables, in its order.
          frozen, declared: as for `apply`.
          settle: whether the step was traced anew.
        """
        applied = self.due_at(step)
        if applied is None:
            return False
        if not (applied or settle):
            return True
        handles = [paths.handle(v) for v in variables]
        state = traits.zeroable_state(optimizer, variables, self.keeps)
        if applied:
            fresh = {
                i: traits.fresh_state(optimizer, variables[i])
                for i in self.regrowing_indices(applied)
            }
            self.apply(
                tf.constant(step, tf.int64),
                handles,
                frozen,
                declared,
                state,
                only=applied,
                fresh=fresh,
            )
        if settle:
            self.settle(handles, frozen, state)
        return True

    def load(self, values):
        """Assigns keep masks `{position: bool array}`; returns those it has none for."""
        rest = {}
        for index, value in values.items():
            keep = self.keeps.get(index)
            if keep is None or tuple(keep.shape) != np.shape(value):
                rest[index] = value
            else:
                keep.assign(np.asarray(value, bool))
        return rest

    def apply(
        self,
        step,
        variables,
        frozen,
        declared,
        state=None,
        only=None,
        gradients=None,
        fresh=None,
    ):
        """In the step: runs each rule that updates at optimizer `step` (traced once).

        A rule that updates gets new keep masks for its variables (all of
        them computed before any is assigned), the weights it drops are set
        to +0.0 with the optimizer state listed for them in `state`, and the
        entries it grows back (a rule that `regrows`) get the fresh state of
        `fresh`. Under a distribution strategy this runs in cross-replica
        context: every replica gets the same masks.

        Args:
          step: the optimizer's `iterations` (a variable or tensor).
          variables: the step's `tf.Variable`s, in its order.
          frozen: positions left out of the step (their masks are not updated).
          declared: `{position: (current, frozen_where)}` for variables with a
            declared mask: its state variable, and a function of its value
            that says where it freezes an entry (those are never dropped).
          state: `{position: [variables of its shape]}`, the optimizer state
            whose dropped entries are set to 0 with the weights
            (`maskfit.optim.traits.zeroable_state`); none by default.
          only: positions in `groups` of the rules to run; all by default.
            Called eagerly (outside the step) this runs them at once.
          gradients: one gradient (or None) per variable of the step, for
            the rules that `uses_gradients` (summed over replicas for them).
          fresh: `{position: [(state variable, fresh value)]}` for the
            variables of rules that regrow (`maskfit.optim.traits.fresh_state`).
        """
        state = state or {}
        groups = [
            (group.rule, [i for i in group.indices if i not in frozen])
            for number, group in enumerate(self.groups)
            if only is None or number in only
        ]
        groups = [(rule, indices) for rule, indices in groups if indices]
        if not groups:
            return

        def apply_all(distribution, gradients):
            value = step.value if isinstance(step, keras.Variable) else step
            current_step = tf.cast(tf.convert_to_tensor(value), tf.int64)
            for rule, indices in groups:

                def update(rule=rule, indices=indices):
                    entries = [
                        (variables[i], i, declared.get(i), state.get(i, ())) for i in indices
                    ]
                    summed = None
                    if rule.uses_gradients:
                        summed = [_summed(distribution, gradients[i]) for i in indices]
                    ops = self._update_group(
                        distribution, rule, current_step, entries, summed, fresh or {}
                    )
                    with tf.control_dependencies(ops):
                        return tf.constant(True)

                tf.cond(
                    rule.should_update(current_step), update, lambda: tf.constant(False)
                )

        internals.merge_call(apply_all, tf.distribute.get_strategy(), gradients)

    def settle(self, variables, frozen, state):
        """Sets every dropped entry to +0.0, in the weights and in `state` (eagerly).

        Outside the step, before the first call of a newly traced one: a
        step that relies on the optimizer keeping dropped entries at 0
        (`maskfit.dropped_entries`) needs their state 0, whatever ran before
        (a step under XLA, which zeroes after each update instead, or weights
        set by hand).

        Args:
          variables: the step's `tf.Variable`s, in its order.
          frozen: positions left out of the step.
          state: `{position: [variables of its shape]}`, as for `apply`.
        """
        for index, keep in self.keeps.items():
            if index in frozen:
                continue
            for target in (variables[index],) + tuple(state.get(index, ())):
                target.assign(mask_state.where_masked(target, keep))

    def _update_group(self, distribution, rule, step, entries, gradients, fresh):
        """New keep masks for one rule's variables; the weights they drop (and their
        state) set to +0.0, the entries they grow back given fresh state.

        Every keep mask is computed (`rule.keep_masks`, from every variable's
        value, read once for all replicas) before any is assigned or any
        weight dropped.

        Args:
          entries: `(variable, position, declared or None, state)` per variable.
          gradients: the variables' summed gradients, or None.
          fresh: as for `apply`.

        Returns:
          The ops that assign the keep masks, drop and regrow.
        """
        weights, protected = [], []
        for variable, index, declared, _ in entries:
            value = tf.convert_to_tensor(variable)
            guarded = None
            if declared is not None:
                # Entries the declared mask freezes (and that are kept) stay.
                frozen = declared[1](tf.convert_to_tensor(declared[0]))
                guarded = tf.logical_and(
                    tf.broadcast_to(frozen, tf.shape(value)),
                    tf.convert_to_tensor(self.keeps[index]),
                )
            weights.append(value)
            protected.append(guarded)
        keeps = [tf.convert_to_tensor(self.keeps[e[1]]) for e in entries]
        kept = list(
            rule.keep_masks(
                step,
                [e[0] for e in entries],
                weights,
                protected,
                keeps=keeps,
                gradients=gradients,
            )
        )
        if len(kept) != len(entries):
            raise ValueError(
                f"{type(rule).__name__}.keep_masks returned {len(kept)} masks for"
                f" {len(entries)} variables; it must return one per variable."
            )

        def assign(target, value):
            return target.assign(value)

        def drop(target, keep):
            return target.assign(mask_state.where_masked(target, keep))

        def regrow(target, grown, value):
            return target.assign(tf.where(grown, tf.cast(value, target.dtype), target))

        finite = None
        if gradients is not None:
            # A loss-scale overflow (the optimizer skipped this step): no update.
            finite = tf.reduce_all(
                [tf.reduce_all(tf.math.is_finite(g)) for g in gradients if g is not None]
            )
        ops = []
        for (variable, index, _, state), keep, guarded in zip(entries, kept, protected):
            keep = _as_keep(keep)
            if guarded is not None:
                keep = tf.logical_or(keep, guarded)
            keep_variable = self.keeps[index]
            if finite is not None:
                keep = tf.where(finite, keep, tf.convert_to_tensor(keep_variable))
            grown = None
            if rule.regrows:
                grown = tf.logical_and(keep, tf.logical_not(tf.convert_to_tensor(keep_variable)))
            ops += tf.nest.flatten(
                distribution.extended.update(keep_variable, assign, args=(keep,), group=False)
            )
            for target in (variable,) + tuple(state):
                ops += tf.nest.flatten(
                    distribution.extended.update(target, drop, args=(keep,), group=False)
                )
            for target, value in fresh.get(index, ()) if grown is not None else ():
                ops += tf.nest.flatten(
                    distribution.extended.update(
                        target, regrow, args=(grown, value), group=False
                    )
                )
        return ops


def _summed(distribution, gradient):
    """A gradient (dense), summed over the replicas of `distribution`."""
    if gradient is None:
        return None
    if distribution.num_replicas_in_sync > 1:
        gradient = distribution.reduce(tf.distribute.ReduceOp.SUM, gradient, axis=None)
    return tf.convert_to_tensor(gradient)


def _start(group, keeps, variables, frozen):
    """Assigns a rule's `initial_keep_masks` (if any) to its new keep masks."""
    covered = [variables[i] for i in group.indices]
    initial = group.rule.initial_keep_masks(
        covered, [frozen.get(i) for i in group.indices]
    )
    if initial is None:
        return
    initial = list(initial)
    if len(initial) != len(covered):
        raise ValueError(
            f"{type(group.rule).__name__}.initial_keep_masks returned {len(initial)}"
            f" masks for {len(covered)} variables of layer '{group.layer.name}'; it"
            " must return one per variable."
        )
    for index, variable, mask in zip(group.indices, covered, initial):
        mask = np.asarray(mask, bool)
        if mask.shape != tuple(variable.shape):
            raise ValueError(
                f"{type(group.rule).__name__}.initial_keep_masks returned a mask of"
                f" shape {mask.shape} for variable '{variable.path}' of shape"
                f" {tuple(variable.shape)}."
            )
        if frozen.get(index) is not None:
            mask = mask | np.broadcast_to(frozen[index], mask.shape)
        keeps[index].assign(mask)
