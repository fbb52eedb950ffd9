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
the step, not callables. Both use the hooks of `maskfit.optim.hooks`.
"""

import contextlib

import keras

from maskfit import internals
from maskfit.optim import hooks

__all__ = ["scaled"]


class _Hooks(hooks.MultiplierHooks):
    """The hooks on one optimizer that steps variables itself."""

    def __init__(self, optimizer, table):
        self.table = table
        super().__init__(optimizer)

    def entry(self, variable):
        return self.table.get(internals.variable_key(self.optimizer, variable))

    def tensor(self, entry, variable, gradient=None):
        m = keras.ops.cast(entry, "float32")
        if self.divides:
            m = keras.ops.where(m > 0, m, keras.ops.ones_like(m))
        return m


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
    installed = []
    try:
        for leaf in internals.optimizers_within(optimizer):
            if internals.optimizers_within(leaf) != [leaf]:
                continue
            table = {
                internals.variable_key(leaf, by_id[i]): m
                for i, m in multipliers.items()
                if i in by_id
            }
            installed.append(_Hooks(leaf, table))
        yield
    finally:
        for hook in reversed(installed):
            hook.remove()
