"""`MultiplierHooks`: one optimizer stepping chosen variables at its learning rate x m.

The rule of learning-rate multipliers, written once for both of its users:
`maskfit.optim.rates` (TensorFlow's `optimizer.apply`, multipliers that may be
callables read on each replica's device) and `maskfit.optim.stateless_rates`
(`optimizer.stateless_apply` in `keras.ops`, multipliers already read). The
hooks replace the optimizer's `update_step`, its decoupled weight decay and
the learning rate that decay reads, as instance attributes (each returns an
undo), so they act on what is traced or run while they are on.

For a variable given a multiplier m, an optimizer in mode `LEARNING_RATE`
(`rate_modes.multiplier_mode`) gets `learning_rate * m` in `update_step`
and in its weight decay (where it divides by its learning rate, m <= 0 is
read as 1: those are frozen entries, which the step holds); one in mode
`STEP` takes its own step, scaled: `old + m * (updated - old)`
(`scale_step`).
"""

import keras

from maskfit import internals
from maskfit.optim import rate_modes
from maskfit.optim.rate_modes import LEARNING_RATE

__all__ = ["MultiplierHooks", "scale_step"]


def scale_step(old, updated, multiplier, ops=keras.ops):
    """Returns `old + multiplier * (updated - old)`: `updated` where it is 1, `old` where 0.

    Args:
      old: the value before a step.
      updated: the value after it.
      multiplier: a tensor that broadcasts to them.
      ops: the module of tensor ops the values take (`keras.ops`, or
        `tensorflow` for `tf.Tensor`s outside Keras).

    Example:

    >>> x = scale_step(keras.ops.ones((3,)), keras.ops.full((3,), 3.0),
    ...                keras.ops.convert_to_tensor([0.0, 0.5, 1.0]))
    >>> keras.ops.convert_to_numpy(x).tolist()
    [1.0, 2.0, 3.0]
    """
    m = ops.cast(multiplier, updated.dtype)
    scaled = old + m * (updated - old)
    return ops.where(m == 1, updated, ops.where(m == 0, old, scaled))


class MultiplierHooks:
    """The hooks on one optimizer that steps variables itself, until `remove`.

    A subclass says where a variable's multiplier comes from and in which ops
    it is a tensor: `entry(variable)` (what was given for it, or None where
    the optimizer's own code steps it, untouched) and `tensor(entry,
    variable, gradient)` (that entry as a float tensor fit for the update,
    read as 1 where it is <= 0 and `self.divides`), with `ops` the module of
    tensor ops and `snapshot` the read of a variable before its step.

    Args:
      optimizer: an optimizer that wraps no other
        (`internals.optimizers_within(optimizer) == [optimizer]`).
    """

    ops = keras.ops

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.mode = rate_modes.multiplier_mode(optimizer)
        rates = rate_modes.keras_rates(optimizer)
        self.divides = (
            rates is not None and rates.divides and self.mode == LEARNING_RATE
        )
        self.decaying = None  # (entry, variable) of the decay being applied
        self._update_step = optimizer.update_step
        self._undo = [
            internals.set_method(optimizer, "update_step", self.update_step),
            internals.hook_weight_decay(optimizer, self.apply_weight_decay),
            internals.hook_current_learning_rate(optimizer, self.current_learning_rate),
        ]

    def entry(self, variable):
        """The multiplier given for `variable`, or None to leave its step alone."""
        raise NotImplementedError

    def tensor(self, entry, variable, gradient=None):
        """`entry` as the float tensor m that the update of `variable` reads."""
        raise NotImplementedError

    def snapshot(self, variable):
        """`variable`'s value before its step (mode `STEP`)."""
        return self.ops.convert_to_tensor(variable)

    def remove(self):
        """Puts the optimizer's own methods back."""
        for undo in reversed(self._undo):
            undo()

    def times(self, learning_rate, m):
        learning_rate = self.ops.convert_to_tensor(learning_rate)
        return learning_rate * self.ops.cast(m, learning_rate.dtype)

    def update_step(self, gradient, variable, learning_rate):
        entry = self.entry(variable)
        if entry is None:
            return self._update_step(gradient, variable, learning_rate)
        m = self.tensor(entry, variable, gradient)
        if self.mode == LEARNING_RATE:
            return self._update_step(gradient, variable, self.times(learning_rate, m))
        old = self.snapshot(variable)
        self._update_step(gradient, variable, learning_rate)
        updated = self.ops.convert_to_tensor(variable)
        variable.assign(scale_step(old, updated, m, self.ops))

    def apply_weight_decay(self, original, variables):
        entries = [self.entry(v) for v in variables]
        plain = [v for v, e in zip(variables, entries) if e is None]
        if plain:
            original(plain)
        for variable, entry in zip(variables, entries):
            if entry is not None:
                # Alone, so that the learning rate it reads is its own.
                self.decaying = (entry, variable)
                try:
                    original([variable])
                finally:
                    self.decaying = None

    def current_learning_rate(self, original):
        learning_rate = original()
        if self.decaying is None:
            return learning_rate
        entry, variable = self.decaying
        return self.times(learning_rate, self.tensor(entry, variable))
