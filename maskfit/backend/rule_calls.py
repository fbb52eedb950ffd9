"""The calls of the JAX train function, with a model's mask rules around them.

`RuleCalls` runs each call of the compiled step: before it, the rules due at
its optimizer step update their keep masks on the host
(`maskfit.backend.jax_rules.HostRules`); on the update steps of a rule that
reads the step's gradients (RigL), a second compiled variant of the step
that also returns them runs instead, and the rule updates after it. `refuse`
says which rules the JAX step cannot run.
"""

from maskfit.backend import jax_rules
from maskfit.spec import rules, version

__all__ = ["RuleCalls", "refuse"]


def refuse(model):
    """Raises for a rule of `model` the JAX step cannot run: one that
    `observes_gradients` in every step (a Taylor importance)."""
    for layer, rule in rules.layer_rules(model):
        if not rule.observes_gradients:
            continue
        raise NotImplementedError(
            f"Layer '{layer.name}' carries the rule {rule!r}, which observes the"
            " gradients of every training step (observes_gradients, e.g. a Taylor"
            " importance): maskfit runs that on the TensorFlow backend only, and"
            " this process runs Keras on JAX. Train with KERAS_BACKEND=tensorflow,"
            " use a rule that reads the weights (an L1/L2 importance) or only its"
            " update steps' gradients (uses_gradients), or remove the rule"
            " (maskfit.spec.rules.set_rule(layer, None))."
        )


class RuleCalls:
    """The calls of one JAX train function, with the model's rules around them.

    Args:
      model: the `MaskedModel`.
      compile_step: `compile_step(gradients)` -> the step as the train
        function runs it, `(state, data, masks)` -> `(logs, state)`, or with
        `gradients` `(logs, state, gradients)` (compiled only when a rule
        that `uses_gradients` first updates).
    """

    def __init__(self, model, compile_step):
        self.model = model
        self.compile_step = compile_step
        self.version = None  # of the declarations `rules` was read at
        self.rules = None  # the `HostRules`, or None without rules
        self.counter = None  # the optimizer step of the next call, on the host
        self.with_gradients = None
        self.given = None  # the masks the last call gave the step

    def __call__(self, step, state, data, masks, fresh):
        """`(logs, state)` of one call of `step` (`fresh`: a state `fit` made)."""
        if self.version != version.current():  # a rule set or removed since
            self.version, self.rules = version.current(), _host_rules(self.model)
            self.counter = None
        self.given = masks
        if self.rules is None:
            return step(state, data, masks)
        if fresh or self.counter is None:
            self.counter = _iterations(self.model.optimizer, state[2])
        at = self.counter
        state, joined = self.rules.before_step(state, masks, at)
        self.given = joined
        self.counter += 1
        if not self.rules.needs_gradients(at):
            return step(state, data, joined)
        if self.with_gradients is None:
            self.with_gradients = self.compile_step(True)
        logs, state, gradients = self.with_gradients(state, data, joined)
        return logs, self.rules.after_update(state, masks, at, gradients)


def _host_rules(model):
    """The model's `HostRules`, or None without rules."""
    if not rules.layer_rules(model):
        return None
    if model.steps_per_execution != 1:
        raise NotImplementedError(
            f"Model '{model.name}' carries mask rules (maskfit.spec.rules: pruning,"
            " sparse training, unit pruning) and was compiled with"
            f" steps_per_execution={model.steps_per_execution}; on the JAX"
            " backend maskfit updates the keep masks between compiled steps, so"
            " it needs steps_per_execution=1. Compile with steps_per_execution=1,"
            " or train with KERAS_BACKEND=tensorflow."
        )
    return jax_rules.HostRules(model)


def _iterations(optimizer, optimizer_values):
    """The optimizer's `iterations` in a state's optimizer values, on the host."""
    for variable, value in zip(optimizer.variables, optimizer_values):
        if variable is optimizer.iterations:
            return int(value)
    return 0
