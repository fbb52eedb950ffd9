"""`GradientMasker`: the masking stage of one training step, over its state.

It reads the masks and rules declared on a model's layers (`sync`), keeps
them as state (`mask_state.MaskStates`, `rules.keeps.RuleKeeps`), plans what
the compiled step does for each variable (`plan.StepPlan`), decides how the
update runs (`update_mode`), and provides the stage's parts: `begin_step`
(select scheduled masks, run the rules due before the forward pass, make the
step's `pipeline.StepView`), `observe`, `mask_gradients`, `apply` (the guarded
update of `maskfit.step.update`) and `after_update`, which `pipeline.run`
calls in order. `maskfit.step.lifecycle` decides when it synchronizes and what
runs just before a call of the compiled step.
"""

import numpy as np
import tensorflow as tf

from maskfit.spec import rules as rules_lib
from maskfit.spec import version
from maskfit.step import declared as declared_lib
from maskfit.step import mask_state, pipeline
from maskfit.step import plan as plan_lib
from maskfit.step import update as update_lib
from maskfit.step.rules import runner as runner_lib

__all__ = ["FUSE_MIN_ENTRIES", "GradientMasker"]

# Compiling the masked update with XLA in a graph-mode step pays when the
# update is memory-bound: below this many entries in the masked variables that
# learn, the XLA call's own fixed cost is more than the snapshot copy and select
# it saves; docs/performance.md has the measurements this threshold comes from.
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
        self._runner = runner_lib.RuleRunner(self._variables)
        self._keeps = self._runner.keeps
        self._last_sync = None
        self._version = None
        self._plan = None
        self._traced_view = None  # the view of the step being traced

    @property
    def plan(self):
        """The `StepPlan` of the steps ahead (None before `sync`)."""
        return self._plan

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
        in_step = self._keeps.in_step_from(step, prepared)
        if (
            self._plan is not None
            and not (fresh or changed)
            and in_step <= self._keeps.in_step
            and self._plan.covers(new)
        ):
            self._plan = self._plan._replace(valid_until=new.valid_until)
            return False
        self._plan, self._keeps.in_step = new, in_step
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
        retrace = self._keeps.update(groups, self._variables, frozen)
        ruled = sorted(i for group in groups for i in group.indices)
        retrace = (
            self._masks.sync(
                declared,
                ruled,
                self._keeps.by_index,
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
        """`items` (aligned with the variables) without the left-out ones."""
        return [x for i, x in enumerate(items) if i not in self._plan.left_out]

    def spread(self, active_items):
        """The inverse of `active`: a full list, with None for the left-out ones."""
        items = iter(active_items)
        return [
            None if i in self._plan.left_out else next(items)
            for i in range(len(self._variables))
        ]

    def learning_at(self, step):
        """Positions of the masked variables whose mask is not all 0 at `step`."""
        return [
            i for i, n in self._masks.needs.items() if not n.frozen[n.interval(step)]
        ]

    def holds_at(self, step, span):
        """Whether the planned step covers a call of `span` steps from `step`."""
        until = self._plan.valid_until
        return until is None or step + span <= until

    @property
    def has_rules(self):
        """Whether a rule (e.g. pruning) changes masks and weights."""
        return bool(self._keeps.groups)

    @property
    def rules_left_out(self):
        """Whether a rule is left out of the planned step (applied by `prepare`)."""
        return self._keeps.left_out

    def keep_masks(self):
        """Returns `{variable position: keep mask}` (bool `tf.Variable`s) of the rules."""
        return dict(self._keeps.by_index)

    def load_keeps(self, values):
        """Assigns keep masks `{position: bool array}`; returns those it has no rule for."""
        return self._keeps.load(values)

    def state_bytes(self):
        """Bytes of mask state kept: masks, schedules, unit layouts, keep masks."""
        keeps = sum(
            k.shape.num_elements() * k.dtype.size for k in self._keeps.by_index.values()
        )
        return self._masks.state_bytes() + keeps

    def mask_variables(self):
        """`{position: [tf.Variable]}`: the mask state each masked variable reads
        (masks, schedules, keep masks); a state an `OutputMask` shares between
        a layer's variables is listed once, at the first."""
        found, seen = {}, set()
        for index, masks in sorted(self._masks.by_index.items()):
            state = masks.state
            held = (
                () if state is None else (state.current, state.table, state.boundaries)
            )
            held = [v for v in (*held, masks.keep) if v is not None]
            found[index] = [v for v in held if id(v) not in seen]
            seen.update(map(id, held))
        return found

    def left_out_variables(self):
        """The variables left out of the planned step (their mask is all 0)."""
        left_out = () if self._plan is None else sorted(self._plan.left_out)
        return [self._variables[i] for i in left_out]

    def read_fresh_state(self, optimizer):
        """Reads the fresh optimizer state regrowing rules give (`RuleRunner`)."""
        self._runner.read_fresh_state(optimizer)

    def rules_due(self, step):
        """Whether a rule of the traced step updates at `step` (None: none in it)."""
        return self._runner.due(step)

    def rule_updates_left_out(self):
        """A context in which a traced step runs no rule's update (`split`)."""
        return self._runner.updates_left_out()

    def update_mode(self, graph=False, xla=False, custom_masking=False):
        """How the step's update runs: a `pipeline.UpdateMode`.

        `FUSED` in a graph-mode step without a strategy once the masked variables
        that learn are large enough to pay (`FUSE_MIN_ENTRIES`); else `PLAIN`.

        Args:
          graph: whether the step is a graph Keras traces (not run eagerly).
          xla: whether that graph is compiled with XLA (`jit_compile=True`).
          custom_masking: whether the gradients may be transformed after
            masking (a subclass overrides `apply_grad_masks`).
        """
        learning = (i for i in self._masks.by_index if i not in self._plan.left_out)
        entries = sum(int(np.prod(self._variables[i].shape)) for i in learning)
        if graph and xla:
            compiled = pipeline.STATIC
        elif graph and not tf.distribute.has_strategy() and entries >= FUSE_MIN_ENTRIES:
            compiled = pipeline.FUSED
        else:
            compiled = pipeline.PLAIN
        return pipeline.UpdateMode(compiled, bool(custom_masking))

    def view(self, step, optimizer, mode=None):
        """The `StepView` of optimizer `step` (a tensor in the step, an int outside)."""
        return pipeline.make_view(
            step, optimizer, mode, self._variables, self._plan, self._masks.by_index
        )

    def prepare(self, step, optimizer, settle, xla=False):
        """Outside the step, before a call at optimizer `step` (`RuleRunner.prepare`)."""
        return self._runner.prepare(self.view(step, optimizer), settle, xla)

    def begin_step(self, optimizer, mode):
        """Selects every scheduled mask, makes the step's view, runs the rules due now.

        Traced once, before the forward pass; returns the `StepView` the rest
        of the stage (`pipeline.run`) reads.

        Args:
          optimizer: the step's optimizer.
          mode: the `UpdateMode` of `update_mode`.
        """
        step = tf.identity(optimizer.iterations)  # this step, before its update
        self._masks.select(step)
        view = self.view(step, optimizer, mode)
        self._runner.before_forward(view)
        self._traced_view = view
        return view

    def observe(self, view, gradients):
        """Right after the gradients: the rules that observe them."""
        self._runner.observe(view, gradients)

    def mask_gradients(self, gradients, view=None):
        """Returns `gradients` with every mask applied (traced once).

        Left-out variables get None; variables whose masks are all 1 over
        the planned steps are passed through.

        Args:
          gradients: one gradient (or None) per variable.
          view: the step's `StepView`; that of the step being traced (its
            last `begin_step`) by default.
        """
        view = view or self._view_in_trace()
        gradients = list(gradients)
        for index in view.left_out:
            gradients[index] = None
        for index, mask in view.masks.items():
            if gradients[index] is not None and mask.masked != plan_lib.NEVER:
                grad_mask = mask.masks.gradient_mask(mask.declared)
                gradients[index] = mask_state.mask_gradient(gradients[index], grad_mask)
        return gradients

    def _view_in_trace(self):
        """The view `begin_step` made in the graph being traced, or a new one."""
        view, here = self._traced_view, None
        if tf.inside_function():
            here = tf.compat.v1.get_default_graph()
        if view is None or getattr(view.step, "graph", None) is not here:
            return self.view(None, None)
        return view

    def apply(self, view, gradients):
        """Runs `optimizer.apply` on the planned variables; frozen entries stay exact.

        The guarded update of `maskfit.step.update`, as `view.mode` says:
        under `FUSED`, where a variable is snapshotted (or a rule's dropped
        entries zeroed), the masking (unless custom), the update and the
        restore are compiled together with XLA, so that the snapshot, the
        optimizer's passes and the restore fuse into one pass over each
        variable. Where the gradients are only masked (plain SGD), they are
        masked in the graph and no XLA call is made: one takes every gradient
        at once, so all of them (a float32 per parameter) would be held
        together, where the graph masks each and applies it as it comes, as
        stock Keras does (issue 43, `benchmarks.scale.step_memory`).

        Args:
          view: the step's `StepView`.
          gradients: one gradient (or None) per variable.
        """
        zeroed = self._keeps.zeroed(view.optimizer, view.variables)
        guards = update_lib.guards(view, zeroed)

        def update(gradients):
            if view.mode.masks_in_update:
                full = self.mask_gradients(self.spread(gradients), view)
                gradients = view.active(full)
            update_lib.apply_guarded(view, gradients, guards)

        if view.mode.compiled == pipeline.FUSED and guards:
            update = tf.function(update, jit_compile=True, autograph=False)
        update(view.active(gradients))

    def after_update(self, view, gradients):
        """After the update: the rules that read the step's gradients."""
        self._runner.after_update(view, gradients)
