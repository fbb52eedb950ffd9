"""Mask rules in the torch step: keep masks computed on the host at update steps.

`HostRules` (`maskfit.backend.host_rules`, shared with JAX) over the torch
step's variables: before the forward pass of an optimizer step where a rule
updates (magnitude pruning at its schedule's steps), the rule's keep masks
are computed on the host from NumPy copies of the weights, the dropped
weights are set to +0.0 in place, and the keep masks are joined to the
step's `StatelessMasks`, so the guard of the update
(`maskfit.backend.torch_guard`) holds each dropped entry and its optimizer
slots bit for bit from then on. Between update steps the joined masks are
reused as they are (the guard's plan with them).

Rules that read gradients (`uses_gradients`, `observes_gradients`: RigL,
Taylor) and rules whose `maskfit.support.FEATURES` row leaves torch out are
refused (`refuse`).
"""

import keras
import torch

from maskfit import internals, support
from maskfit.backend import host_rules
from maskfit.spec import rules, version

__all__ = ["TorchRules", "joined", "refuse"]

_ATTR = "_maskfit_torch_rules"  # (key, TorchRules or None) on the model


def refuse(model):
    """Raises for a rule of `model` the torch step does not run."""
    for layer, rule in rules.layer_rules(model):
        feature = rules._backend_feature(rule)
        if support.runs_on(feature) and not (
            rule.uses_gradients or rule.observes_gradients
        ):
            continue
        raise NotImplementedError(
            f"Layer '{layer.name}' carries the rule {type(rule).__name__}"
            f" ({support.FEATURES[feature].name}), which maskfit does not run in"
            " the training step on the PyTorch backend; this process runs Keras"
            " on torch. Train it with KERAS_BACKEND=tensorflow or"
            " KERAS_BACKEND=jax, or remove the rule with"
            " maskfit.spec.rules.set_rule(layer, None)."
        )


class TorchRules(host_rules.HostRules):
    """The mask rules of one model's torch step, run on the host at their update steps.

    Args:
      model: a `MaskedModel` whose rules the torch backend runs.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = pruning.prune_low_magnitude(
    ...     keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    >>> len(TorchRules(model).groups)
    1
    """

    def masks(self, masks, step):
        """`masks` with the keep masks in force at optimizer `step` (an int)
        joined, after the rules due at `step` updated the variables in place."""
        if self._started and not self.updating(step):
            return self.joined(masks)
        optimizer = self.model.optimizer
        slots = optimizer.variables if optimizer is not None else []
        state = ([v.value.detach() for v in self.variables], (), _detached(slots))
        new, joined = self.before_step(state, masks, step)
        with torch.no_grad():
            for variable, old, value in zip(self.variables, state[0], new[0]):
                if value is not old:
                    variable.assign(value)
            for variable, old, value in zip(slots, state[2], new[2]):
                if value is not old:
                    variable.assign(value)
        return joined

    def _numpy(self, value):
        return keras.ops.convert_to_numpy(value)

    def _where(self, keep, value, other):
        keep = torch.as_tensor(keep, device=value.device)
        other = torch.as_tensor(other, dtype=value.dtype, device=value.device)
        return torch.where(keep, value, other)

    def _join(self, masks, keeps, values):
        return host_rules.join_keeps(masks, keeps, keras.ops.convert_to_tensor)


def _detached(variables):
    return [v.value.detach() for v in variables]


@torch.compiler.disable
def joined(model, masks, variables):
    """The step's masks: `masks` with the keep masks of `model`'s rules joined
    (after the rules due at this optimizer step updated), or `masks` as they
    are for a model without rules.

    Host work (NumPy, the rules' `tf.function`s): under `torch.compile`
    (`jit_compile=True`) it runs eagerly at every call of the compiled step,
    never traced into it.
    """
    key = (version.current(), tuple(id(v) for v in variables))
    cached = getattr(model, _ATTR, None)
    if cached is None or cached[0] != key:
        if not rules.layer_rules(model):
            cached = (key, None)
        else:
            refuse(model)
            cached = (key, TorchRules(model))
        internals.set_untracked(model, _ATTR, cached)
    if cached[1] is None:
        return masks
    optimizer = model.optimizer
    step = int(optimizer.iterations.value) if optimizer.built else 0
    return cached[1].masks(masks, step)
