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

from maskfit.spec import rules as rules_lib
from maskfit.spec import version
from maskfit.step import declared as declared_lib
from maskfit.step import mask_state, rule_stage
from maskfit.step import plan as plan_lib
from maskfit.step import update as update_lib

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
        self.rules = rule_stage.RuleStage(self._variables)
        self._rules = self.rules.state
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
                declared,
                ruled,
                self._rules.keeps,
                self._variables,
                step,
                self._skip_frozen,
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

    def prepare(self, step, optimizer, settle, xla=False):
        """Outside the step, before a call at optimizer `step` (`RuleStage.prepare`)."""
        return self.rules.prepare(
            step,
            optimizer,
            self.plan.frozen,
            self._masks.declared_current(),
            settle,
            xla,
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
        """Selects every scheduled mask, then runs the rules due before the forward pass.

        Traced once (`RuleStage.before_forward`).
        """
        self._masks.select(step)
        self.rules.before_forward(
            step, optimizer, self.plan.frozen, self._masks.declared_current()
        )

    def observe(self, step, gradients):
        """Right after the gradients: the rules that observe them (`RuleStage.observe`)."""
        self.rules.observe(step, gradients, self.plan.frozen)

    def after_update(self, step, optimizer, gradients):
        """After the update: the rules that read gradients (`RuleStage.after_update`)."""
        self.rules.after_update(
            step, optimizer, self.plan.frozen, self._masks.declared_current(), gradients
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
        self,
        optimizer,
        gradients,
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
                optimizer,
                gradients,
                variables,
                self.active(variables),
                guards,
                masks,
                rates,
            )

        if fuse and (guards or (mask_first and masks)):
            run = tf.function(run, jit_compile=True, autograph=False)
        run(self.active(gradients))
