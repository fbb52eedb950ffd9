"""Taylor sums in the JAX step: carried as values through the compiled step.

On TensorFlow a rule that `observes_gradients` (`UnitPruning` with a Taylor
importance) adds `|w * g|` to its own `tf.Variable`s in every step. Under
JAX the step is stateless, so `GradientSums` carries the same sums as
arrays: the compiled step takes them after Keras's four state lists and
returns them with `added_by_gradient` of that step added (the weights before
the update, the dense gradients of the loss as `optimizer.scale_loss` scaled
it), with no host work per step. They are written to the rule's variables
before one of its updates (which reads and restarts them), when Keras
writes the JAX state into the model (`jax_state_sync`: end of `fit`, a
callback's `model`), so saving finds them, and read back from them when
`fit` starts a state. Each sum is laid out like its variable.
"""

import jax
import numpy as np

from maskfit.step import stateless

__all__ = ["ATTR", "GradientSums", "refuse"]

# The model attribute that holds its `GradientSums` (`jax_state_sync` writes them).
ATTR = "_maskfit_jax_sums"


def refuse(model, layer_rules):
    """Raises for a rule that `observes_gradients` but has no stateless sums."""
    for layer, rule in layer_rules:
        if rule.observes_gradients and not hasattr(rule, "added_by_gradient"):
            raise NotImplementedError(
                f"Layer '{layer.name}' carries the rule {rule!r}, which observes the"
                " gradients of every training step (observes_gradients) with its"
                " own state (observe_gradients): the JAX step cannot run that, and"
                " this process runs Keras on JAX. Give the rule `gradient_sums` and"
                " `added_by_gradient` (as maskfit's UnitPruning does), train with"
                " KERAS_BACKEND=tensorflow, or remove the rule"
                " (maskfit.spec.rules.set_rule(layer, None))."
            )


class GradientSums:
    """The sums of a model's rules that observe gradients, by variable position.

    Args:
      groups: the `HostRules`' groups (`maskfit.spec.rules.resolve_rules`).
      variables: the step's trainable variables, in its order.

    Attributes:
      positions: the positions (in `variables`) whose sums the step carries.
    """

    def __init__(self, groups, variables):
        self.positions, self._targets, self._rules = [], [], []
        for group in groups:
            if not group.rule.observes_gradients:
                continue
            covered = [variables[i] for i in group.indices]
            for i, total in zip(group.indices, group.rule.gradient_sums(covered)):
                if total is not None:
                    self.positions.append(i)
                    self._targets.append(total)
                    self._rules.append(group.rule)
        self._observing = {id(g.rule) for g in groups if g.rule.observes_gradients}
        self.value = None  # the sums the last call returned (JAX arrays)
        self.written = True  # whether the rules' variables hold `value`

    def __bool__(self):
        return bool(self.positions)

    def due(self, groups):
        """Whether one of `groups` (due to update) reads the sums."""
        return any(id(g.rule) in self._observing for g in groups)

    def read(self, values):
        """Takes the sums from the rules' variables, laid out like `values`' arrays."""
        self.value = tuple(
            jax.device_put(np.asarray(t.numpy()), getattr(values[i], "sharding", None))
            for i, t in zip(self.positions, self._targets)
        )
        self.written = True
        return self.value

    def write(self):
        """Writes the sums the step returned into the rules' variables."""
        if self.written or self.value is None:
            return
        for total, value in zip(self._targets, self.value):
            total.assign(np.asarray(value))
        self.written = True

    def returned(self, value):
        """Keeps the sums a call returned (not yet in the rules' variables)."""
        self.value = value
        self.written = False

    def shardings(self, trainable_shardings):
        """The output shardings of the sums: their variables'."""
        return tuple(trainable_shardings[i] for i in self.positions)

    def added(self, model, sums, values, gradients, optimizer_values):
        """The sums after one step (traced inside it): each plus its rule's
        `added_by_gradient` of the weights before the update and the step's
        gradients."""
        step = stateless.optimizer_step(model.optimizer, optimizer_values)
        out = []
        for total, i, rule in zip(sums, self.positions, self._rules):
            if gradients[i] is None:
                out.append(total)
                continue
            out.append(total + rule.added_by_gradient(step, values[i], gradients[i]))
        return tuple(out)
