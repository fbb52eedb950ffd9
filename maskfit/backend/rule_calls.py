"""The calls of the JAX train function, with a model's mask rules around them.

`RuleCalls` runs each call of the compiled step: before it, the rules due at
its optimizer step update their keep masks on the host
(`maskfit.backend.jax_rules.HostRules`); on the update steps of a rule that
reads the step's gradients (RigL), a second compiled variant of the step
that also returns them runs instead, and the rule updates after it. The
Taylor sums of rules that observe every step's gradients travel through the
step as values (`maskfit.backend.jax_taylor.GradientSums`), written to the
rules' variables only before an update that reads them. `refuse` says which
rules the JAX step cannot run.
"""

from maskfit import internals
from maskfit.backend import jax_rules, jax_taylor
from maskfit.spec import rules, version

__all__ = ["RuleCalls", "refuse"]


def refuse(model):
    """Raises for a rule of `model` the JAX step cannot run: one that
    `observes_gradients` with state of its own and no stateless sums
    (`maskfit.backend.jax_taylor`)."""
    jax_taylor.refuse(model, rules.layer_rules(model))


class RuleCalls:
    """The calls of one JAX train function, with the model's rules around them.

    Args:
      model: the `MaskedModel`.
      compile_step: `compile_step(gradients, sums=None)` -> the step as the
        train function runs it, `(state, data, masks)` -> `(logs, state)`, or
        with `gradients` `(logs, state, gradients)` (compiled only when a rule
        that `uses_gradients` first updates); with `sums` (a
        `GradientSums`), the state carries the sums after its four lists.
    """

    def __init__(self, model, compile_step):
        self.model = model
        self.compile_step = compile_step
        self.version = None  # of the declarations `rules` was read at
        self.rules = None  # the `HostRules`, or None without rules
        self.counter = None  # the optimizer step of the next call, on the host
        self.with_gradients = None
        self.given = None  # the masks the last call gave the step
        self.sums = None  # the `GradientSums` the step carries, or None
        self.steps = {}  # with_gradients -> the step compiled to carry `sums`

    def __call__(self, step, state, data, masks, fresh):
        """`(logs, state)` of one call of `step` (`fresh`: a state `fit` made)."""
        if self.version != version.current():  # a rule set or removed since
            if self.sums:
                self.sums.write()
            self.version, self.rules = version.current(), _host_rules(self.model)
            self.counter, self.sums, self.steps = None, None, {}
            if self.rules is not None:
                self.sums = jax_taylor.GradientSums(
                    self.rules.groups, self.rules.variables
                )
            internals.set_untracked(self.model, jax_taylor.ATTR, self.sums)
        self.given = masks
        if self.rules is None:
            return step(state, data, masks)
        sums = self.sums or None
        if fresh or self.counter is None:
            self.counter = _iterations(self.model.optimizer, state[2])
            if sums is not None:
                sums.write()  # a state made anew: the sums are in the variables
                sums.read(state[0])
        at = self.counter
        reads_sums = sums is not None and sums.due(self.rules.updating(at))
        if reads_sums:
            sums.write()
        state, joined = self.rules.before_step(state, masks, at)
        if reads_sums:  # the update restarted them
            sums.read(state[0])
        self.given = joined
        self.counter += 1
        gradients = self.rules.needs_gradients(at)
        if sums is not None:
            if gradients not in self.steps:
                self.steps[gradients] = self.compile_step(gradients, sums)
            out = self.steps[gradients](tuple(state) + (sums.value,), data, joined)
            sums.returned(out[1][4])
            out = (out[0], tuple(out[1][:4])) + tuple(out[2:])
        elif not gradients:
            return step(state, data, joined)
        else:
            if self.with_gradients is None:
                self.with_gradients = self.compile_step(True)
            out = self.with_gradients(state, data, joined)
        if not gradients:
            return out
        logs, state, gradients = out
        return logs, self.rules.after_update(state, masks, at, gradients)


def _host_rules(model):
    """The model's `HostRules`, or None without rules."""
    if not rules.layer_rules(model):
        return None
    return jax_rules.HostRules(model)


def _iterations(optimizer, optimizer_values):
    """The optimizer's `iterations` in a state's optimizer values, on the host."""
    for variable, value in zip(optimizer.variables, optimizer_values):
        if variable is optimizer.iterations:
            return int(value)
    return 0
