"""Which optimizers keep a dropped entry at +0 on their own, once its state is 0.

A rule (pruning) drops an entry by setting it to +0.0 and masking its
gradient to 0. Most Keras optimizers would still move it: momentum, Adam's
history, accumulated gradients and EMA averages carry what the entry learned
before. The safe way, for any optimizer, is to put every dropped entry back
to 0 after each update; it costs a pass over the variable and an assignment
per variable and step. For the optimizers listed here, an entry whose value, gradient and every
per-variable state (slots, accumulated gradients, EMA average) are 0 is left
at exactly +0.0, with that state still 0, by every setting they have: weight
decay (`w - w * wd * lr`), clipping, gradient accumulation, EMA, loss
scaling. So the state of the dropped entries is zeroed once, when the rule
drops them, and the step needs nothing after the update.

Checked against the update rules of Keras 3.10 to 3.15: each divides only by
`epsilon`-shifted terms (so `epsilon` must be > 0), and an update of
`gradient * a` or `slot * b` is 0 when both are. Subclasses are not trusted
(they may override `update_step`), nor variables with a constraint (it may
move a 0).
"""

import numbers

import keras

from maskfit import internals

__all__ = ["keeps_dropped_entries_at_zero", "state_of"]

_ELEMENTWISE = tuple(
    getattr(keras.optimizers, name)
    for name in (
        "SGD",
        "Adam",
        "AdamW",
        "Adamax",
        "Nadam",
        "RMSprop",
        "Adagrad",
        "Lion",
    )
)


def keeps_dropped_entries_at_zero(optimizer, variable):
    """Whether `optimizer` leaves an entry of `variable` at +0.0 by itself.

    That is, an entry that is +0.0, gets a 0 gradient, and whose state in
    the optimizer (`state_of`) is 0, stays +0.0 and keeps a 0 state.

    Args:
      optimizer: a Keras optimizer, or a `LossScaleOptimizer` around one.
      variable: a model variable.

    Returns:
      True for an optimizer of the listed types (not a subclass) with
      `epsilon` > 0 where it has one, on a variable without a constraint.

    Example:

    >>> import keras
    >>> from maskfit import dropped_entries
    >>> v = keras.Variable([1.0, 0.0])
    >>> dropped_entries.keeps_dropped_entries_at_zero(keras.optimizers.Adam(), v)
    True
    >>> dropped_entries.keeps_dropped_entries_at_zero(
    ...     keras.optimizers.Adam(epsilon=0.0), v)
    False
    """
    inner = optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = optimizer.inner_optimizer
    if type(inner) not in _ELEMENTWISE or variable.constraint is not None:
        return False
    epsilon = getattr(inner, "epsilon", 1.0)
    return isinstance(epsilon, numbers.Real) and epsilon > 0


def state_of(optimizer, variable):
    """Returns every per-variable state `optimizer` keeps for `variable`.

    Slots (momentum, Adam's moments...), accumulated gradients and the EMA
    average, in a fixed order; [] while the optimizer is not built (a fresh
    build starts them at 0, or for Adagrad at a value a 0 gradient never
    uses).
    """
    found = []
    for each in internals.optimizers_within(optimizer):
        if not each.built:
            continue
        slots, _ = internals.optimizer_state(each)
        for (_, owner), slot in sorted(slots.items(), key=lambda item: item[0][0]):
            if owner == id(variable):
                found.append(slot)
    return found
