"""The masking stage of one step, written once: its view, its update mode, its order.

`GradientMasker.begin_step` makes a `StepView` at the start of a step: the
optimizer step, the optimizer, the `UpdateMode`, which variables are left
out, and each masked variable's mask of this step (`MaskOfStep`, expanded
once). `run` then takes the step's gradients through the stage's named
parts, in the order Keras's `BaseOptimizer.apply` runs its own (drop what has
no gradient, transform the gradients, update, then what follows the update):

1. `observe`: rules that watch gradients see them as computed;
2. `mask`: the gradients masked (`MaskedModel.apply_grad_masks`, or the
   masker's own masking), unless the fused update masks them itself;
3. `update`: guards, snapshots, `optimizer.apply` with the learning-rate
   multipliers, restores (`maskfit.step.update`);
4. `after_update`: rules that read the step's gradients.

`MaskedModel.train_step` and `maskfit.apply_gradients` both call `run` with
the view `begin_step` gave them; only the forward pass (the model's) sits
between the two.
"""

import collections

from maskfit.step import mask_state

__all__ = [
    "FUSED",
    "MaskOfStep",
    "PLAIN",
    "STATIC",
    "StepView",
    "UpdateMode",
    "make_view",
    "run",
]

# How the update is compiled (`UpdateMode.compiled`).
PLAIN = "plain"  # eagerly or in a graph: a snapshot only when the mask has a 0
STATIC = "static"  # under XLA: every snapshot taken (XLA fuses it in)
FUSED = "fused"  # a graph-mode step whose masking, update and restore are
# compiled together with XLA where a variable is snapshotted (`GradientMasker.apply`)


class UpdateMode(collections.namedtuple("UpdateMode", ["compiled", "custom_masking"])):
    """How one step's update runs, as decided by `GradientMasker.update_mode`.

    Attributes:
      compiled: `PLAIN`, `STATIC` or `FUSED`.
      custom_masking: whether the gradients reaching the update may have been
        transformed after masking (a subclass overrides `apply_grad_masks`):
        every masked variable is then snapshotted and restored, whatever the
        optimizer, and the fused update does not mask them itself.
    """

    @property
    def exact(self):
        """Whether the update gets exactly the masked gradients."""
        return not self.custom_masking

    @property
    def dynamic(self):
        """Whether a snapshot is taken only when the mask in force has a 0."""
        return self.compiled == PLAIN and self.exact

    @property
    def masks_in_update(self):
        """Whether the fused update masks the gradients itself (`mask` skipped)."""
        return self.compiled == FUSED and self.exact


class MaskOfStep(
    collections.namedtuple(
        "MaskOfStep", ["masks", "declared", "masked", "guarded", "scaled"]
    )
):
    """One masked variable in one step.

    Attributes:
      masks: its `mask_state.VariableMasks` (state, layout, keep mask, scale).
      declared: the declared mask in force, expanded to (a shape that
        broadcasts to) the variable: a tensor read once in the step, or None
        (a rule's keep mask only).
      masked, guarded, scaled: the plan's `NEVER` / `ALWAYS` / `SOMETIMES`
        for the variable (`maskfit.step.plan.StepPlan`).
    """

    @property
    def frozen(self):
        """Where `declared` freezes an entry (bool), or None.

        One elementwise op on the expanded mask, made where it is used: in a
        fused update, inside the XLA computation, which fuses it.
        """
        return None if self.declared is None else mask_state.is_frozen(self.declared)


class StepView(
    collections.namedtuple(
        "StepView", ["step", "optimizer", "mode", "variables", "left_out", "masks"]
    )
):
    """What one step's masking stage reads, made once per step by `begin_step`.

    Attributes:
      step: the optimizer step this update is (a tensor read before it).
      optimizer: the step's optimizer.
      mode: the step's `UpdateMode`.
      variables: the step's variables, in its order (left-out ones too).
      left_out: positions of the variables left out of the step (their mask
        is all 0: no gradient, no update).
      masks: `{position: MaskOfStep}` of the masked variables in the step.

    Example:

    >>> view = StepView(0, None, UpdateMode(PLAIN, False), ("a", "b"), {1}, {})
    >>> view.active(["ga", "gb"])
    ['ga']
    """

    def active(self, items):
        """`items` (aligned with the variables) without the left-out ones."""
        return [x for i, x in enumerate(items) if i not in self.left_out]


def make_view(step, optimizer, mode, variables, plan, masks):
    """The `StepView` of one step: each mask in force read once and expanded.

    Args:
      step: the optimizer step (a tensor in the step, an int outside it).
      optimizer: the step's optimizer.
      mode: the `UpdateMode`; `PLAIN` with exact masking if None.
      variables: the step's variables, in its order.
      plan: the step's `StepPlan`.
      masks: `{position: VariableMasks}` of the masked variables.
    """
    found = {}
    for i, entry in masks.items():
        if i in plan.left_out:
            continue
        declared = None
        if entry.state is not None:
            declared = entry.expand(entry.state.current)
        found[i] = MaskOfStep(
            entry, declared, plan.masked[i], plan.guarded[i], plan.scaled[i]
        )
    mode = mode or UpdateMode(PLAIN, False)
    return StepView(step, optimizer, mode, tuple(variables), plan.left_out, found)


def run(masker, view, gradients, mask=None):
    """Runs the masking stage on the step's gradients, in order (see the module).

    Args:
      masker: the step's `GradientMasker`.
      view: the `StepView` its `begin_step` made for this step.
      gradients: one gradient (or None) per variable of the step.
      mask: a function of the gradients returning the masked ones
        (`MaskedModel.apply_grad_masks`); the masker's own by default.
    """
    masker.observe(view, gradients)
    raw = gradients
    if not view.mode.masks_in_update:
        if mask is None:
            gradients = masker.mask_gradients(gradients, view)
        else:
            gradients = mask(gradients)
    masker.apply(view, gradients)
    masker.after_update(view, raw)
