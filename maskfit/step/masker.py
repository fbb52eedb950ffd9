"""`GradientMasker`: the masking stage of one training step, over its state.

It reads the masks and rules declared on a model's layers (`sync`), keeps
them as state (`mask_state.MaskStates`, `rule_state.RuleState`), plans what
the compiled step does for each variable (`plan.StepPlan`), and runs the
stage's parts in the step, in order: `begin_step` (select scheduled masks, run
the rules that update now), `mask_gradients`, and `apply` (the guarded
update of `maskfit.step.update`). `maskfit.step.lifecycle` decides when it
synchronizes and what runs just before a call of the compiled step.
"""

import numpy as np
import tensorflow as tf

from maskfit import internals
from maskfit.optim import traits
from maskfit.spec import rules as rules_lib
from maskfit.spec import version
from maskfit.step import declared as declared_lib
from maskfit.step import mask_state
from maskfit.step import plan as plan_lib
from maskfit.step import rule_state
from maskfit.step import update as update_lib
from maskfit.paths import handle as variable_handle

__all__ = ["FUSE_MIN_ENTRIES", "GradientMasker"]

# Compiling the masked update with XLA in a graph-mode step pays when the
# update is memory-bound: below this many entries in the masked variables that
# learn, the XLA call's own cost (about 0.5 ms a step on a 2-core CPU) is more
# than the snapshot copy and select it saves (about 1.4 ms per million guarded
# entries under AdamW); docs/performance.md has the measurements.
FUSE_MIN_ENTRIES = 1 << 19


class GradientMasker:
    """The masks and rules of one training step, as state, and their stage.

    The masks live in non-trainable `tf.Variable`s made once, outside the
    compiled step, so the step reads them instead of baking them in: new mask
    values (of the same structure) reach the next step without a retrace, and
    a schedule switches inside the step at the exact optimizer step.

    Args:
      variables: the trainable variables of the step, in its order.
      layer_specs: a callable returning `[(layer, spec)]`, the masks to read,
        e.g. `lambda: declare.masked_layers(model)`.
      layer_rules: a callable returning `[(layer, rule)]`, the rules to apply,
        e.g. `lambda: rules.layer_rules(model)`; none by default.
      skip_frozen: whether fully frozen variables are left out of the step;
        False where the optimizer is not the masker's to rebuild
        (`maskfit.apply_gradients`): they are then masked and restored.
    """

    def __init__(self, variables, layer_specs, layer_rules=tuple, skip_frozen=True):
        self._variables = list(variables)
        self._layer_specs = layer_specs
        self._layer_rules = layer_rules
        self._skip_frozen = skip_frozen
        self._masks = mask_state.MaskStates()
        self._rules = rule_state.RuleState()
        self._fresh = {}  # {position: [(state, fresh value)]} of regrowing rules
        self._last_sync = None
        self._version = None
        self.plan = None

    # ------------------------------------------------------------ host side

    @property
    def variables(self):
        """The step's variables, in its order (fully frozen ones included)."""
        return list(self._variables)

    def covers(self, variables):
        """Whether this masker was made for exactly `variables`, in order."""
        return len(variables) == len(self._variables) and all(
            a is b for a, b in zip(variables, self._variables)
        )

    def sync(self, step, span=1, fresh=False, prepared=True):
        """Reads the declarations and plans the step from optimizer `step`.

        Returns True if the step must be traced again: the masks' or rules'
        structure changed, or the plan did. A rule whose updates are over
        stays in a step already traced (it no longer fires; a retrace would
        cost more than it saves) and is left out when the step is traced
        anew: when it must be, or will be anyway (`fresh`, after `compile`).

        Args:
          step: the optimizer step the next call starts at.
          span: how many steps a call of the compiled step runs
            (`steps_per_execution`).
          fresh: whether the step will be traced anew whatever this returns.
          prepared: whether `prepare` runs before each new call (then a rule
            whose last update is the call's first step is applied there, not
            traced into the step).
        """
        key = (step, span, prepared, version.current())
        if key == self._last_sync and not fresh:
            return False  # nothing the plan depends on changed
        changed = self._read_declarations(step)
        self._last_sync = key
        self._rules.prepared = prepared
        needs = self._masks.needs
        if not self._skip_frozen:
            needs = {
                i: n._replace(frozen=(False,) * len(n.frozen)) for i, n in needs.items()
            }
        new = plan_lib.plan_steps(needs, step, span, total=len(self._variables))
        in_step = self._rules.in_step_from(step, prepared)
        if (
            self.plan is not None
            and not (fresh or changed)
            and in_step <= self._rules.in_step
            and self.plan.covers(new)
        ):
            self.plan = self.plan._replace(valid_until=new.valid_until)
            return False
        self.plan, self._rules.in_step = new, in_step
        return True

    def _read_declarations(self, step):
        """Makes the state match the declarations, if any changed; True to retrace."""
        current = version.current()
        if current == self._version:
            return False
        declared = declared_lib.resolve_declared(self._layer_specs(), self._variables)
        groups = tuple(rules_lib.resolve_rules(self._layer_rules(), self._variables))
        frozen = {
            index: mask.frozen_at(step, i, tuple(self._variables[index].shape))
            for mask in (declared.values() if groups else ())
            for i, index in enumerate(mask.indices)
        }
        retrace = self._rules.update(groups, self._variables, frozen)
        ruled = sorted(i for group in groups for i in group.indices)
        retrace = (
            self._masks.sync(
                declared, ruled, self._rules.keeps, self._variables, step, self._skip_frozen
            )
            or retrace
        )
        self._version = current
        return retrace

    @property
    def masked_indices(self):
        """Positions, in the step's variable list, of the variables with a mask."""
        return sorted(self._masks.by_index)

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
        return [
            i for i, n in self._masks.needs.items() if not n.frozen[n.interval(step)]
        ]

    def holds_at(self, step, span):
        """Whether the planned step covers a call of `span` steps from `step`."""
        until = self.plan.valid_until
        return until is None or step + span <= until

    @property
    def scheduled(self):
        """Whether `begin_step` does work: a mask follows a schedule, or a rule applies."""
        return bool(self._rules.in_step_where(False)) or self._masks.scheduled

    @property
    def has_rules(self):
        """Whether a rule (e.g. pruning) changes masks and weights."""
        return bool(self._rules.groups)

    @property
    def rules_left_out(self):
        """Whether a rule is left out of the planned step (applied by `prepare`)."""
        return self._rules.left_out

    def keep_masks(self):
        """Returns `{variable position: keep mask}` (bool `tf.Variable`s) of the rules."""
        return dict(self._rules.keeps)

    def load_keeps(self, values):
        """Assigns keep masks `{position: bool array}`; returns those it has no rule for."""
        return self._rules.load(values)

    def state_bytes(self):
        """Bytes of mask state kept: masks, schedules, unit layouts, keep masks."""
        keeps = sum(
            k.shape.num_elements() * k.dtype.size for k in self._rules.keeps.values()
        )
        return self._masks.state_bytes() + keeps

    def read_fresh_state(self, optimizer):
        """Reads, outside the step, the fresh optimizer state of every variable a
        regrowing rule covers (`optim.traits.fresh_state`), for the step to use.

        Call it whenever the optimizer was (re)built. A masker planned inside
        the step's first trace has none until then: an entry grown back in
        that first call keeps the state it has (fresh, unless it learned and
        was dropped within that call).
        """
        regrowing = self._rules.regrowing_indices(range(len(self._rules.groups)))
        self._fresh = {
            i: traits.fresh_state(optimizer, self._variables[i]) for i in sorted(regrowing)
        }

    def prepare(self, step, optimizer, settle):
        """Outside the step, before a call at optimizer `step`: `RuleState.prepare`."""
        return self._rules.prepare(
            step,
            optimizer,
            self._variables,
            self.plan.frozen,
            self._masks.declared_current(),
            settle,
        )

    def fusing_pays(self):
        """Whether the masked variables that learn are large enough to `apply` fused."""
        entries = sum(
            int(np.prod(self._variables[i].shape))
            for i in self._masks.by_index
            if i not in self.plan.frozen
        )
        return entries >= FUSE_MIN_ENTRIES

    # ------------------------------------------------------------- in step

    def begin_step(self, step, optimizer):
        """Selects every scheduled mask, then applies the rules, for optimizer `step`.

        Traced once. A rule that updates in this step (and does not read
        its gradients) gets new keep masks, and the weights it drops are set
        to +0.0 before the forward pass; where `optimizer` keeps such entries
        at 0 by itself, so is their state in it, and `apply` leaves them
        alone (not under XLA, where the zeroing after the update fuses in).
        """
        self._masks.select(step)
        self._run_rules(step, optimizer, self._rules.in_step_where(False))

    @property
    def observes_gradients(self):
        """Whether a rule sees the step's gradients (`observe`)."""
        return any(group.rule.observes_gradients for group in self._rules.groups)

    @property
    def updates_after(self):
        """Whether a rule that reads gradients runs in the step (`after_update`)."""
        return bool(self._rules.in_step_where(True))

    def observe(self, step, gradients):
        """Gives each rule that `observes_gradients` its variables' gradients (traced once).

        Right after the gradients are computed, before they are masked.
        """
        for group in self._rules.groups:
            if not group.rule.observes_gradients:
                continue
            pairs = [
                (variable_handle(self._variables[i]), gradients[i])
                for i in group.indices
                if gradients[i] is not None and i not in self.plan.frozen
            ]
            if pairs:
                group.rule.observe_gradients(
                    step, [v for v, _ in pairs], [g for _, g in pairs]
                )

    def after_update(self, step, optimizer, gradients):
        """After the update: the rules that read the step's gradients (traced once).

        Each rule that `uses_gradients` and updates at `step` (the optimizer
        step the update just ran) gets new keep masks from the weights and the
        step's gradients: the entries it drops are set to +0.0, the ones it
        grows start at 0 with a fresh optimizer's state, so only entries kept
        before and after learn in an update step. A step whose gradients are
        not finite (a loss-scale overflow: the optimizer skipped it) skips
        the rules' update too.

        Args:
          step: the optimizer's `iterations` before this step's update.
          optimizer: the step's optimizer.
          gradients: one gradient (or None) per variable, unmasked.
        """
        self._run_rules(step, optimizer, self._rules.in_step_where(True), gradients)

    def _run_rules(self, step, optimizer, numbers, gradients=None):
        """Runs the rules at `numbers` (in the step's groups) that update at `step`."""
        if not numbers:
            return
        rules = self._rules
        zeroed = set() if internals.tracing_for_xla() else rules.indices_in_step()
        regrowing = rules.regrowing_indices(numbers)
        fresh = {i: f for i, f in self._fresh.items() if i in regrowing}
        rules.apply(
            step,
            [variable_handle(v) for v in self._variables],
            self.plan.frozen,
            self._masks.declared_current(),
            traits.zeroable_state(optimizer, self._variables, zeroed),
            only=numbers,
            gradients=gradients,
            fresh=fresh,
        )

    def mask_gradients(self, gradients):
        """Returns `gradients` with every mask applied (traced once).

        Frozen variables get None; variables whose masks are all 1 over the
        planned steps are passed through.
        """
        gradients = list(gradients)
        for index, masks in self._masks.by_index.items():
            if index in self.plan.frozen:
                gradients[index] = None
            elif (
                gradients[index] is not None
                and self.plan.masked[index] != plan_lib.NEVER
            ):
                mask = masks.gradient_mask(
                    None if masks.state is None else masks.state.current, masks.keep
                )
                gradients[index] = mask_state.mask_gradient(gradients[index], mask)
        return gradients

    def apply(
        self, optimizer, gradients, masked=True, static=False, fuse=False, mask_first=False
    ):
        """Runs `optimizer.apply` on the planned variables; frozen entries stay exact.

        Args:
          optimizer: a Keras optimizer (a `LossScaleOptimizer` too), built for
            the variables that are not frozen (or for all of them).
          gradients: one gradient (or None) per variable.
          masked: whether `gradients` are exactly what `mask_gradients`
            returned (else every masked variable is snapshotted and restored).
          static: True under XLA (snapshots are always taken).
          fuse: compile the update and the restore together with XLA (in a
            graph-mode step without a distribution strategy), so that the
            snapshot, the optimizer's passes and the restore fuse into one
            pass over each variable instead of a copy and a select.
          mask_first: apply `mask_gradients` inside the fused update.
        """
        variables, masks = self._variables, self._masks.by_index
        guards = update_lib.guards(
            self.plan,
            masks,
            optimizer,
            variables,
            masked,
            static,
            fuse,
            zeroed=self._rules.zeroed(optimizer, variables),
        )

        # Values other than 0 and 1 of `scale="step"` masks multiply the
        # learning rate: read in the update, on each replica's device.
        rates = [
            (variables[i], lambda entry=masks[i]: entry.declared(entry.state.current))
            for i, mode in self.plan.scaled.items()
            if mode != plan_lib.NEVER
        ]

        def run(gradients):
            if mask_first:
                gradients = self.active(self.mask_gradients(self.spread(gradients)))
            update_lib.apply_guarded(
                optimizer, gradients, variables, self.active(variables), guards, masks, rates
            )

        if fuse and (guards or (mask_first and masks)):
            run = tf.function(run, jit_compile=True, autograph=False)
        run(self.active(gradients))
