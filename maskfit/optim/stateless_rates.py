"""Learning-rate multipliers in a stateless update, with `keras.ops` only.

`scaled(optimizer, multipliers)` does for `optimizer.stateless_apply` what
`maskfit.optim.rates.scaled_learning_rates` does for TensorFlow's
`optimizer.apply`, by the same rule (`rate_modes`): every optimizer within
`optimizer` passes `learning_rate * m` to its `update_step` and its
decoupled weight decay for each variable given a multiplier `m` (entries
with m = 0 keep m = 1 under an optimizer that divides by its learning rate:
they are frozen entries, which the step holds), and an optimizer class not
known to use its learning rate that way gets its step scaled instead
(`old + m * (updated - old)`). Multipliers here are values already read in
the step, not callables.
"""

import contextlib

import keras

from maskfit import internals
from maskfit.optim import rate_modes
from maskfit.optim.rate_modes import LEARNING_RATE

__all__ = ["scaled"]


def _scale_step(old, updated, m):
    m = keras.ops.cast(m, updated.dtype)
    scaled = old + m * (updated - old)
    return keras.ops.where(m == 1, updated, keras.ops.where(m == 0, old, scaled))


class _Hooks:
    """The hooks on one optimizer that steps variables itself."""

    def __init__(self, optimizer, table):
        self.optimizer = optimizer
        self.table = table
        self.mode = rate_modes.multiplier_mode(optimizer)
        rates = rate_modes.keras_rates(optimizer)
        self.divides = (
            rates is not None and rates.divides and self.mode == LEARNING_RATE
        )
        self.decaying = None
        self._update_step = optimizer.update_step
        self.undo = [
            internals.set_method(optimizer, "update_step", self.update_step),
            internals.hook_weight_decay(optimizer, self.apply_weight_decay),
            internals.hook_current_learning_rate(optimizer, self.current_learning_rate),
        ]

    def multiplier(self, variable):
        m = self.table.get(internals.variable_key(self.optimizer, variable))
        if m is None:
            return None
        m = keras.ops.cast(m, "float32")
        if self.divides:
            m = keras.ops.where(m > 0, m, keras.ops.ones_like(m))
        return m

    def update_step(self, gradient, variable, learning_rate):
        m = self.multiplier(variable)
        if m is None:
            return self._update_step(gradient, variable, learning_rate)
        if self.mode == LEARNING_RATE:
            learning_rate = keras.ops.convert_to_tensor(learning_rate)
            scaled = learning_rate * keras.ops.cast(m, learning_rate.dtype)
            return self._update_step(gradient, variable, scaled)
        old = keras.ops.convert_to_tensor(variable)
        self._update_step(gradient, variable, learning_rate)
        variable.assign(_scale_step(old, keras.ops.convert_to_tensor(variable), m))

    def apply_weight_decay(self, original, variables):
        scaled = [self.multiplier(v) is not None for v in variables]
        plain = [v for v, s in zip(variables, scaled) if not s]
        if plain:
            original(plain)
        for variable, s in zip(variables, scaled):
            if s:
                self.decaying = variable  # alone: its learning rate is its own
                try:
                    original([variable])
                finally:
                    self.decaying = None

    def current_learning_rate(self, original):
        learning_rate = original()
        if self.decaying is None:
            return learning_rate
        m = self.multiplier(self.decaying)
        learning_rate = keras.ops.convert_to_tensor(learning_rate)
        return learning_rate * keras.ops.cast(m, learning_rate.dtype)


@contextlib.contextmanager
def scaled(optimizer, multipliers):
    """Steps each variable in `multipliers` at the learning rate x its multiplier.

    Use it around `optimizer.stateless_apply` (or `apply`), where it is
    traced or run.

    Args:
      optimizer: a built Keras optimizer.
      multipliers: `{id(variable): m}` for variables the optimizer was built
        for; `m` a tensor that broadcasts to the variable.

    Example:

    >>> v = keras.Variable([1.0, 1.0])
    >>> sgd = keras.optimizers.SGD(0.5)
    >>> sgd.build([v])
    >>> with scaled(sgd, {id(v): keras.ops.convert_to_tensor([0.1, 1.0])}):
    ...     new, _ = sgd.stateless_apply(
    ...         [x.value for x in sgd.variables], [keras.ops.ones((2,))], [v.value])
    >>> [round(float(x), 4) for x in keras.ops.convert_to_numpy(new[0])]
    [0.95, 0.5]
    """
    if not multipliers:
        yield
        return
    by_id = {id(v): v for v in internals.optimizer_built_variables(optimizer)}
    hooks = []
    try:
        for leaf in internals.optimizers_within(optimizer):
            if internals.optimizers_within(leaf) != [leaf]:
                continue
            table = {
                internals.variable_key(leaf, by_id[i]): m
                for i, m in multipliers.items()
                if i in by_id
            }
            hooks.append(_Hooks(leaf, table))
        yield
    finally:
        for hook in reversed(hooks):
            for undo in reversed(hook.undo):
                undo()
