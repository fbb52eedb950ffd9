"""The masking stage of a step: mask gradients, apply, keep frozen entries exact."""

import keras
import numpy as np
import tensorflow as tf

from maskfit import declare
from maskfit import dropped_entries
from maskfit import internals
from maskfit import mask_rules
from maskfit import plan
from maskfit import rule_state
from maskfit import slot_state
from maskfit import step_plan
from maskfit.plan import resolve_masks

__all__ = [
    "GradientMasker",
    "ema_averages",
    "moves_zero_gradient_entries",
    "resolve_masks",
    "variable_handle",
]


def moves_zero_gradient_entries(optimizer, variable):
    """Whether `optimizer` can move an entry of `variable` whose gradient is 0.

    Only plain SGD (no momentum, weight decay, clipping, EMA) on a variable
    without a constraint is known to leave such entries bit-identical; every
    other optimizer gets a snapshot and restore around its update.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if type(inner) is not keras.optimizers.SGD:
        return True
    settings = (
        inner.momentum,
        inner.weight_decay,
        inner.use_ema,
        inner.clipnorm,
        inner.clipvalue,
        inner.global_clipnorm,
    )
    return any(settings) or variable.constraint is not None


def _mask_gradient(gradient, mask):
    if isinstance(gradient, tf.IndexedSlices):
        # `mask` has the variable's rank; a size-1 first axis broadcasts
        # against the gathered rows, any other is gathered with them.
        same = mask.shape[0] == 1
        rows = mask if same else tf.gather(mask, gradient.indices)
        values = slot_state.where_masked(gradient.values, rows)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return slot_state.where_masked(gradient, mask)


def variable_handle(variable):
    """The `tf.Variable` behind a Keras variable (itself for a TF variable)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


# Compiling the masked update with XLA in a graph-mode step pays when the
# update is memory-bound: below this many entries in the masked variables that
# learn, the XLA call's own cost (about 0.5 ms a step on a 2-core CPU) is more
# than the snapshot copy and select it saves (about 1.4 ms per million guarded
# entries under AdamW); docs/performance.md has the measurements.
FUSE_MIN_ENTRIES = 1 << 19


class GradientMasker:
    """Holds the masks of one training step as state and applies them.

    The masks live in non-trainable `tf.Variable`s made once, outside the
    compiled step, so the step reads them instead of baking them in: new mask
    values (of the same structure) reach the next step without a retrace, and
    a schedule switches inside the step at the exact optimizer step.

    In the step, `begin_step` selects each scheduled mask; `mask_gradients`
    zeroes (or scales) the gradient entries of masked units or entries with
    `multiply_no_nan`, so NaN or Inf there never spreads, and clipping sees
    only what may learn. `apply` runs the optimizer and, for every optimizer that can
    move a zero-gradient entry (weight decay, momentum, Adam history, EMA,
    constraints...), restores each frozen entry from a snapshot taken just
    before, so it stays bit-identical.

    What the step does for each variable is fixed by a `step_plan.StepPlan`
    for the steps ahead: a variable whose mask is all 0 gets no gradient, no
    update and no snapshot (`frozen_indices`), one whose mask is all 1 is not
    masked, and only one with a 0 somewhere is restored. `update` and
    `replan` say when a new plan needs the step traced again.

    Rules (`maskfit.mask_rules`, e.g. pruning) add a keep mask per variable
    they cover, recomputed by `begin_step` in the step; dropped entries are
    set to 0 after each update (no snapshot needed for them), entries the
    declared mask freezes are restored as usual.

    Args:
      variables: the trainable variables of the step, in its order.
      layer_specs: a callable returning `[(layer, spec)]`, the masks to read,
        e.g. `lambda: declare.masked_layers(model)`.
      layer_rules: a callable returning `[(layer, rule)]`, the rules to apply,
        e.g. `lambda: mask_rules.layer_rules(model)`; none by default.
      prepares: whether the caller runs `prepare` before the first call of
        each newly traced step (outside it): a rule whose last update is in
        that call's first step is then applied there instead of traced.
      step: a callable returning the optimizer step the masks start at.
      span: how many steps one call of the compiled step runs
        (`steps_per_execution`).
      skip_frozen: whether fully frozen variables are left out of the step;
        False where the optimizer is not the masker's to rebuild
        (`maskfit.apply_gradients`): they are then masked and restored.
    """

    def __init__(
        self,
        variables,
        layer_specs,
        step=lambda: 0,
        span=1,
        skip_frozen=True,
        layer_rules=tuple,
        prepares=False,
    ):
        self._variables = list(variables)
        self._layer_specs = layer_specs
        self._layer_rules = layer_rules
        self._step = step
        self._span = span
        self._skip_frozen = skip_frozen
        self._slots = {}  # key -> MaskSlot
        self._states = {}  # key -> slot_state.SlotState
        self._by_index = {}  # variable position -> slot_state.VariableMasks
        self._needs = {}  # variable position -> step_plan.VariableNeeds
        self._rules = rule_state.RuleState()  # the rules' keep masks
        self._traced = frozenset()  # positions of the rules the step runs
        self._prepares = prepares
        self._due = False  # whether `prepare` is to run before the next call
        self._settle = False  # whether it settles dropped entries (a new trace)
        self._version = None
        self.plan = None
        self.update()

    @property
    def variables(self):
        """The step's variables, in its order (fully frozen ones included)."""
        return list(self._variables)

    def plans(self, variables):
        """Whether this masker was planned for exactly `variables`, in order."""
        return len(variables) == len(self._variables) and all(
            a is b for a, b in zip(variables, self._variables)
        )

    @property
    def masked_indices(self):
        """Positions, in the step's variable list, of the variables with a mask."""
        return sorted(self._by_index)

    @property
    def frozen_indices(self):
        """Positions of the variables the planned step leaves out (mask all 0)."""
        return sorted(self.plan.frozen)

    def active(self, items):
        """`items` (aligned with the variables) without the frozen ones."""
        return [x for i, x in enumerate(items) if i not in self.plan.frozen]

    def spread(self, active_items):
        """The inverse of `active`: a full list, with None for the frozen ones."""
        items = iter(active_items)
        return [
            None if i in self.plan.frozen else next(items)
            for i in range(len(self._variables))
        ]

    def learning_at(self, step):
        """Positions of the masked variables whose mask is not all 0 at `step`."""
        return [i for i, n in self._needs.items() if not n.frozen[n.interval(step)]]

    def holds_at(self, step):
        """Whether the planned step covers the next call, from optimizer step `step`."""
        until = self.plan.valid_until
        return until is None or step + self._span <= until

    def replan(self, step, span=None, prepares=None, fresh=False):
        """Plans the step from optimizer `step`; True if it must be traced again.

        The step runs the rules that may still update after `step` (or at
        it, unless `prepares`). A rule whose updates are over stays in a step
        already traced (it no longer fires; a retrace would cost more than
        it saves) and is left out when the step is traced anew: when it must
        be (a rule joins, the plan changed) or will be anyway (`fresh`: after
        `compile`, say).
        """
        if span is not None:
            self._span = span
        if prepares is not None:
            self._prepares = prepares
        new = self._plan_at(step)
        traced = self._rules.in_step_from(step, self._prepares)
        if (
            self.plan is not None
            and not fresh
            and traced <= self._traced
            and self.plan.covers(new)
        ):
            self.plan = self.plan._replace(valid_until=new.valid_until)
            return False
        self.plan = new
        self._traced = traced
        return True

    def _traced_indices(self):
        """Positions of the variables whose rule the step runs."""
        return self._rules.indices_of(self._traced)

    def expect_call(self, new_trace):
        """Says that the step is about to be called (`fit`, `train_on_batch`).

        `prepare` is then due before that call, if a rule is outside the
        step (it may be due, or the optimizer may have gone back before its
        last update) or the step is traced anew (`new_trace`: dropped
        entries are settled then).
        """
        rules = bool(self._rules.groups)
        self._settle = rules and (self._settle or new_trace)
        self._due = self._settle or len(self._traced) < len(self._rules.groups)

    @property
    def prepare_due(self):
        """Whether `prepare` is to run before the next call of the step."""
        return self._due

    def prepare(self, step, optimizer):
        """Outside the step, before the first call after `expect_call`, at `step`.

        Applies each rule that the step leaves out and whose last update is
        at `step` (the call's first step). For a newly traced step it also
        sets every dropped entry to +0.0, weights and the state `optimizer`
        keeps for them (`RuleState.settle`). Returns False, doing nothing,
        when a rule left out of the step may still update after `step` (the
        optimizer went back, e.g. restored from an earlier backup): the step
        must be planned again.
        """
        applied = self._rules.due_at(step, self._traced)
        if applied is None:
            return False
        if not (applied or self._settle):
            self._due = False
            return True
        variables = [variable_handle(v) for v in self._variables]
        state = self._trusted_state(optimizer, self._rules.keeps)
        if applied:
            self._rules.apply(
                tf.constant(step, tf.int64),
                variables,
                self.plan.frozen,
                self._declared(),
                state,
                only=applied,
            )
        if self._settle:
            self._rules.settle(variables, self.plan.frozen, state)
        self._due = self._settle = False
        return True

    def _declared(self):
        """`{position: (current, frozen_where)}` of the variables with a declared mask."""
        return {
            i: (masks.state.current, masks.frozen_where)
            for i, masks in self._by_index.items()
            if masks.state is not None
        }

    def _trusted_state(self, optimizer, positions):
        """`{position: [state variables]}` of `optimizer` for those of `positions`
        whose dropped entries it keeps at 0 by itself (`dropped_entries`)."""
        return {
            i: [variable_handle(v) for v in dropped_entries.state_of(optimizer, variable)]
            for i, variable in enumerate(self._variables)
            if i in positions
            and dropped_entries.keeps_dropped_entries_at_zero(optimizer, variable)
        }

    def _plan_at(self, step):
        needs = self._needs if self._skip_frozen else {
            i: n._replace(frozen=(False,) * len(n.frozen)) for i, n in self._needs.items()
        }
        return step_plan.plan_steps(needs, step, self._span, total=len(self._variables))

    @property
    def scheduled(self):
        """Whether `begin_step` does work: a mask follows a schedule, or a rule applies."""
        return bool(self._traced) or any(
            s is not None and s.table is not None for s in self._states.values()
        )

    @property
    def has_rules(self):
        """Whether a rule (e.g. pruning) changes masks and weights in `begin_step`."""
        return bool(self._rules.groups)

    def keep_masks(self):
        """Returns `{variable position: keep mask}` (bool `tf.Variable`s) of the rules."""
        return dict(self._rules.keeps)

    def load_keeps(self, values):
        """Assigns keep masks `{position: bool array}`; returns those it has no rule for."""
        return self._rules.load(values)

    def state_bytes(self):
        """Bytes of mask state this masker keeps (masks, schedules, boundaries).

        The constant unit-layout indices of `OutputMask` slots count too.
        """
        total = 0
        for state in filter(None, self._states.values()):
            for variable in (state.current, state.table, state.boundaries):
                if variable is not None:
                    total += variable.shape.num_elements() * variable.dtype.size
        for slot in self._slots.values():
            total += sum(layout.index.nbytes for layout in slot.layouts or ())
        for keep in self._rules.keeps.values():
            total += keep.shape.num_elements() * keep.dtype.size
        return total

    def mask_value(self, index):
        """Returns the mask in force for variable `index` as a numpy array.

        It broadcasts against the variable (an `OutputMask`'s values expanded
        onto it, shared entries 1).
        """
        return self._variable_mask(index).numpy()

    def _variable_mask(self, index):
        """The mask on variable `index`, broadcastable to it (traced in the step)."""
        masks = self._by_index[index]
        return masks.combined(
            None if masks.state is None else masks.state.current, masks.keep
        )

    def update(self, force=False):
        """Reads the specs again; returns True if the step must retrace.

        Values of existing masks are assigned in place. A slot whose spec was
        removed keeps an all-ones mask, so removal needs no retrace either.
        """
        version = (declare.mask_version(), mask_rules.rule_version())
        if version == self._version and not force:
            return False
        slots = plan.plan_masks(self._layer_specs(), self._variables)
        groups = tuple(mask_rules.resolve_rules(self._layer_rules(), self._variables))
        for key, slot in self._slots.items():
            if key not in slots:
                slots[key] = slot._replace(table=np.ones_like(slot.table))
        step = int(self._step())
        needs = {
            index: slot_state.variable_needs(slot, i)
            for slot in slots.values()
            for i, index in enumerate(slot.indices)
        }
        ruled = sorted(i for group in groups for i in group.indices)
        for index in ruled:
            needs[index] = step_plan.VariableNeeds.ruled(needs.get(index))
        retrace = self._rules.update(groups, self._variables)
        states = {}
        # (If every variable is masked and always frozen, one stays in the
        # step, so the optimizer's steps count on: all keep their state then.)
        # Without skip_frozen (apply_gradients) every mask is read in the step.
        skippable = self._skip_frozen and (
            len(needs) < len(self._variables)
            or not all(all(n.frozen) for n in needs.values())
        )
        for key, slot in slots.items():
            if (
                skippable
                and slot.kind == "element"
                and all(all(needs[i].frozen) for i in slot.indices)
            ):
                # Never in the step: its mask is never read there.
                states[key] = None
                retrace = retrace or self._states.get(key) is not None
                continue
            dtype = slot_state.state_dtype(slot, self._variables[slot.indices[0]].dtype)
            state = self._states.get(key)
            if state is not None and state.structure == (slot.structure, dtype):
                state.assign(slot, step)
                states[key] = state
                continue
            state = slot_state.SlotState(slot, dtype)
            state.assign(slot, step)
            states[key] = state
            if slot.backprop:
                declare.set_gate_values(slot.layer, state.current)
            retrace = True
        self._states = states
        self._slots = slots
        self._by_index = {
            index: slot_state.VariableMasks(
                states[key],
                None if slot.layouts is None else slot.layouts[i],
                self._rules.keeps.get(index),
            )
            for key, slot in slots.items()
            for i, index in enumerate(slot.indices)
        }
        for index in ruled:
            if index not in self._by_index:
                self._by_index[index] = slot_state.VariableMasks(None, None, self._rules.keeps[index])
        self._needs = needs
        self._version = version
        return self.replan(step) or retrace

    def begin_step(self, step, optimizer):
        """Selects every scheduled mask, then applies the rules, for optimizer `step`.

        Traced once. A rule that updates in this step gets new keep masks,
        and the weights it drops are set to +0.0 before the forward pass;
        where `optimizer` keeps such entries at 0 by itself
        (`dropped_entries`), so is their state in it, and `apply` leaves them
        alone.
        """
        for state in self._states.values():
            if state is not None and state.table is not None:
                state.select(step)
        if self._traced:
            # Under XLA, dropped entries are zeroed after each update instead.
            traced = set() if internals.tracing_for_xla() else self._traced_indices()
            self._rules.apply(
                step,
                [variable_handle(v) for v in self._variables],
                self.plan.frozen,
                self._declared(),
                self._trusted_state(optimizer, traced),
                only=self._traced,
            )

    def mask_gradients(self, gradients):
        """Returns `gradients` with every mask applied (traced once).

        Frozen variables get None; variables whose masks are all 1 over the
        planned steps are passed through.
        """
        gradients = list(gradients)
        for index in self._by_index:
            if index in self.plan.frozen:
                gradients[index] = None
            elif (
                gradients[index] is not None
                and self.plan.masked[index] != step_plan.NEVER
            ):
                gradients[index] = _mask_gradient(
                    gradients[index], self._variable_mask(index)
                )
        return gradients

    def fusing_pays(self, variables=None):
        """Whether the masked variables that learn are large enough to `apply` fused.

        At least `FUSE_MIN_ENTRIES` entries in all; see `apply`'s `fuse`.
        """
        variables = self._variables if variables is None else list(variables)
        entries = sum(
            int(np.prod(variables[i].shape))
            for i in self._by_index
            if i not in self.plan.frozen
        )
        return entries >= FUSE_MIN_ENTRIES

    def apply(
        self,
        optimizer,
        gradients,
        variables=None,
        masked=True,
        static=False,
        fuse=False,
        mask_first=False,
    ):
        """Runs `optimizer.apply` on the planned variables; frozen entries stay exact.

        Args:
          optimizer: a Keras optimizer (a `LossScaleOptimizer` too), built for
            the variables that are not frozen (or for all of them).
          gradients: one gradient (or None) per variable.
          variables: the step's variables; by default those given at build.
          masked: whether `gradients` are known to be exactly what
            `mask_gradients` returned. When they may have been transformed
            after masking, every masked variable is snapshotted and restored,
            whatever the optimizer.
          static: True under XLA, where a snapshot taken only when the mask
            in force has a 0 cannot be expressed; one is always taken (XLA
            fuses it into the update).
          fuse: compile the update and the restore together with XLA (in a
            graph-mode step without a distribution strategy), so that the
            snapshot, the optimizer's passes and the restore fuse into one
            pass over each variable instead of a copy and a select.
        """
        variables = self._variables if variables is None else list(variables)
        # Where dropped entries' state may be nonzero under XLA: a rule the
        # step runs, or any rule when nobody runs `prepare` to settle them.
        traced = self._traced_indices() if self._prepares else set(self._rules.keeps)
        # (position, whether the snapshot is taken only if needed, whether one
        # is taken at all: a rule's dropped entries are set to 0, not restored)
        guarded = []
        for i, masks in self._by_index.items():
            if i in self.plan.frozen:
                continue
            mode = self.plan.guarded[i]
            restore = masks.state is not None and (
                not masked
                or (
                    mode != step_plan.NEVER
                    and moves_zero_gradient_entries(optimizer, variables[i])
                )
            )
            dynamic = masked and mode == step_plan.SOMETIMES and not (static or fuse)
            # A rule's dropped entries stay 0 by themselves under the
            # optimizers of `dropped_entries` (begin_step zeroed their state),
            # if the gradients are masked as planned.
            zeroes = masks.keep is not None and not (
                masked and _zeroes_state(optimizer, variables[i], i in traced)
            )
            if restore or zeroes:
                guarded.append((i, dynamic and restore, restore))

        def update(gradients):
            if mask_first:
                gradients = self.active(self.mask_gradients(self.spread(gradients)))
            snapshots = [
                self._snapshot(variables[i], i, dynamic) if restore else None
                for i, dynamic, restore in guarded
            ]
            optimizer.apply(gradients, self.active(variables))
            if guarded:
                self._restore(
                    optimizer,
                    [variables[i] for i, _, _ in guarded],
                    snapshots,
                    [self._by_index[i] for i, _, _ in guarded],
                )

        if fuse and (guarded or (mask_first and self._by_index)):
            update = tf.function(update, jit_compile=True, autograph=False)
        update(self.active(gradients))

    def _snapshot(self, variable, index, dynamic):
        """The variable's value before the update; under a dynamic guard, only if needed.

        Returns `(needed, value)`: `needed` is None for a snapshot always taken,
        else a boolean tensor (the mask in force has a 0); `value` is then an
        empty tensor when not needed, so nothing is copied.
        """
        handle = variable_handle(variable)
        if not dynamic:
            return None, tf.identity(handle)
        masks = self._by_index[index]
        needed = tf.reduce_any(slot_state.is_frozen(masks.declared(masks.state.current)))
        value = tf.cond(
            needed,
            lambda: tf.identity(handle),
            lambda: tf.zeros([0], handle.dtype),
        )
        return needed, value

    def _restore(self, optimizer, variables, snapshots, masks):
        """Puts back the frozen entries from `snapshots`, zeroes the dropped ones.

        Each variable's EMA average gets the same. `snapshots` has a
        `(needed, value)` per variable, or None when only dropped entries
        (a rule's) are to be zeroed.
        """
        averages = ema_averages(optimizer, variables)
        targets = [variable_handle(v) for v in variables]

        def restore_all(distribution, snapshots):
            for target, snapshot, entry, average in zip(
                targets, snapshots, masks, averages
            ):
                needed, snapshot = (None, None) if snapshot is None else snapshot
                # What the per-replica restore reads: the snapshot and the
                # declared mask (if restored), the keep mask (if a rule's).
                args = () if snapshot is None else (snapshot, entry.state.current)
                args += () if entry.keep is None else (entry.keep,)

                def restore(
                    target, *values, entry=entry, needed=needed, restores=snapshot is not None
                ):
                    def put_back():
                        value = tf.convert_to_tensor(target)
                        if restores:
                            kept, current = values[:2]
                            frozen = slot_state.is_frozen(entry.declared(current))
                            value = tf.where(frozen, tf.reshape(kept, tf.shape(value)), value)
                        if entry.keep is not None:
                            value = slot_state.where_masked(value, values[-1])
                        return target.assign(value)

                    if needed is None:
                        return put_back()

                    def put_back_if_needed():
                        with tf.control_dependencies([put_back()]):
                            return tf.constant(True)

                    return tf.cond(needed, put_back_if_needed, lambda: tf.constant(False))

                for variable in (target, average):
                    if variable is not None:
                        distribution.extended.update(
                            variable_handle(variable), restore, args=args, group=False
                        )

        internals.merge_call(restore_all, tf.distribute.get_strategy(), snapshots)


def _zeroes_state(optimizer, variable, traced):
    """Whether a rule's dropped entries of `variable` get their optimizer state
    zeroed when dropped, and nothing after each update (`dropped_entries`).

    Not under XLA for a rule the step runs (`traced`): there the zeroing
    after the update fuses into it, while optimizer state written in the
    rule's conditional would be one more operand of it in every step. A rule
    the step leaves out had its dropped entries' state zeroed by `prepare`.
    """
    return dropped_entries.keeps_dropped_entries_at_zero(optimizer, variable) and not (
        traced and internals.tracing_for_xla()
    )


def ema_averages(optimizer, variables):
    """Returns each variable's EMA average in `optimizer`, or None per variable.

    A frozen entry's average is pinned to its value so that
    `finalize_variable_values` at the end of `fit` (which copies the averages
    into the model) cannot move it.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    averages = internals.ema_averages_by_variable(inner)
    return [averages.get(id(v)) for v in variables]
