"""The masked training step: Keras's own `train_step`, with the masking stage in it."""

import functools

from maskfit import internals, paths, support
from maskfit.step import lifecycle as lifecycle_lib

__all__ = ["MaskedTraining", "all_trainable_variables", "keep_masks", "masker_of"]

_LIFECYCLE_ATTR = "_maskfit_step_lifecycle"
# Set by `maskfit.backend.jax_taylor` (`ATTR`): the sums the JAX step carries.
_JAX_SUMS_ATTR = "_maskfit_jax_sums"


class MaskedTraining:
    """The training step of `MaskedModel` and `MaskedSequential`.

    It is the Keras trainer's own `train_step` of the backend Keras runs on,
    with the masking stage in it (`maskfit.backend`). On TensorFlow:
    `GradientMasker.begin_step` (the step's view) before the forward pass,
    the gradients of the variables that can learn, then
    `maskfit.step.pipeline.run`, which runs the stage's parts in their one
    order (`apply_grad_masks` among them); when the step is planned, traced
    and prepared is the model's `StepLifecycle`'s business
    (`maskfit.step.lifecycle`); under `jit_compile=True` with rules, the
    function Keras traces around it only picks one of its two compiled
    variants (`maskfit.step.split`). On JAX: the stateless
    `train_step(state, data)` of Keras's JAX trainer, its update
    `maskfit.step.stateless.stateless_apply` with the masks as arguments of
    the compiled step.
    """

    def train_step(self, *args):
        # `(data)` on TensorFlow, `(state, data)` on JAX: as Keras's trainer calls it.
        return support.step_backend().train_step(self, *args)

    def apply_grad_masks(self, gradients, variables):
        """The masking stage: returns the gradients that `optimizer.apply` gets.

        The default zeroes the gradient of every frozen entry (NaN and Inf
        included) and scales those of partially masked ones. Override it to
        transform gradients (add noise, clip per layer) and call
        `super().apply_grad_masks(...)` to keep the masks; whatever a subclass
        does here, entries whose mask is 0 are restored after the update.

        Args:
          gradients: one gradient (or None) per variable, as from the tape;
            None for a variable whose mask is all 0 (it is not updated at
            all, whatever this returns for it).
          variables: every trainable variable (fully frozen ones too), in
            the order of `gradients`.

        Returns:
          The list of gradients to apply, aligned with `variables`.
        """
        return support.step_backend().apply_grad_masks(self, gradients, variables)

    def _maskfit_update_mode(self, masker):
        """The masker's `UpdateMode` for this model's compile settings."""
        overridden = type(self).apply_grad_masks is not MaskedTraining.apply_grad_masks
        return masker.update_mode(
            graph=not self.run_eagerly,
            xla=bool(self.jit_compile),
            custom_masking=overridden,
        )

    def make_train_function(self, force=False):
        """Builds the step; retraces only when the masks' structure changed.

        The step is planned for the optimizer steps ahead: which variables
        are left out (mask all 0) and which are masked and restored. When a
        schedule reaches a step the plan does not cover, the optimizer is
        fitted to the new plan and the step traced again, before the call
        that runs that step.
        """
        return support.step_backend().make_train_function(self, force=force)

    def jax_state_sync(self):
        """Writes the JAX trainer's state into the variables (Keras does it at
        the end of `fit` and when a callback reads its `model`), and the
        Taylor sums the JAX step carries into their rule's variables."""
        sync = getattr(super(), "jax_state_sync", None)
        if sync is not None:
            sync()
        sums = getattr(self, _JAX_SUMS_ATTR, None)
        if sums:
            sums.write()

    def _maskfit_lifecycle(self):
        lifecycle = getattr(self, _LIFECYCLE_ATTR, None)
        if lifecycle is None:
            keras_make = functools.partial(super().make_train_function)
            own = internals.defining_class(type(self), "train_step") is MaskedTraining
            lifecycle = lifecycle_lib.StepLifecycle(
                self, keras_make, own_train_step=own
            )
            internals.set_untracked(self, _LIFECYCLE_ATTR, lifecycle)
        return lifecycle

    # Keras reads these to build the optimizer (fit under a strategy, loading,
    # BackupAndRestore) and to copy EMA averages in at the end of fit, so a
    # variable whose mask is all 0 is reported as trainable=False reports it.
    @property
    def trainable_weights(self):
        return self._without_frozen(super().trainable_weights)

    @property
    def trainable_variables(self):
        return self._without_frozen(super().trainable_variables)

    @property
    def non_trainable_weights(self):
        return self._with_frozen(super().non_trainable_weights, super().weights)

    @property
    def non_trainable_variables(self):
        return self._with_frozen(super().non_trainable_variables, super().variables)

    def _all_trainable_weights(self):
        """The trainable weights, fully frozen ones included: what masks cover."""
        return super().trainable_weights

    def _left_out_ids(self):
        masker = masker_of(self)
        if masker is None:
            return frozenset()
        return frozenset(id(v) for v in masker.left_out_variables())

    def _without_frozen(self, variables):
        left_out = self._left_out_ids()
        if not left_out:
            return variables
        return [v for v in variables if id(v) not in left_out]

    def _with_frozen(self, non_trainable, every):
        left_out = self._left_out_ids()
        if not left_out or not self.trainable:
            return non_trainable
        kept = left_out | {id(v) for v in non_trainable}
        return [v for v in every if id(v) in kept]


def masker_of(model):
    """The `GradientMasker` of a masked model's step, or None (not planned yet)."""
    lifecycle = getattr(model, _LIFECYCLE_ATTR, None)
    return None if lifecycle is None else lifecycle.masker


def all_trainable_variables(model):
    """A model's trainable variables, those whose mask is all 0 included.

    A `MaskedModel` reports a variable whose mask is all 0 as not trainable,
    as `trainable=False` would (its optimizer has no slots for it); masks
    and `maskfit.summary` still cover it.
    """
    if isinstance(model, MaskedTraining):
        return model._all_trainable_weights()
    return list(model.trainable_variables)


def keep_masks(model):
    """Returns `{position: bool array}`: the keep masks of the rules (pruning) on `model`.

    Positions are in `all_trainable_variables(model)`. A variable that a rule
    covers but that has not been trained yet has none (nothing is dropped);
    one whose masks were loaded but not planned yet has the loaded ones.
    """
    if not isinstance(model, MaskedTraining):
        return {}
    lifecycle = model._maskfit_lifecycle()
    keys = paths.variable_keys(model, all_trainable_variables(model))
    position = {key: i for i, key in enumerate(keys)}
    values = {
        position[k]: v for k, v in lifecycle.pending_keeps.items() if k in position
    }
    masker = lifecycle.masker
    if masker is not None:
        values.update({i: k.numpy() for i, k in masker.keep_masks().items()})
    return values
