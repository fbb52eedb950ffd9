"""Rebuilding an optimizer for another set of variables, keeping the state of those it keeps.

A fully frozen variable costs nothing when the optimizer has no slots for it,
as with `trainable=False`. When the set of learnable variables changes (a mask
turns a variable fully frozen, or back), the optimizer is rebuilt in place for
the new set: variables it had before keep every slot value (momentum, Adam
history, EMA average, accumulated gradients), new ones start as a fresh
optimizer would start them, and the state of the optimizer itself (iterations,
learning rate, loss scale) is kept. The object stays the same, so references
that users and callbacks hold to it stay valid.
"""

import keras
import tensorflow as tf

from maskfit import internals

__all__ = ["built_variables", "rebuild", "restart"]


def built_variables(optimizer):
    """Returns the variables `optimizer` was built for, in order ([] if not built)."""
    if not optimizer.built:
        return []
    return list(internals.optimizer_built_variables(optimizer))


def rebuild(optimizer, variables, fresh=()):
    """Builds `optimizer` for `variables`, keeping the state it has for them.

    Args:
      optimizer: a Keras optimizer, built or not (a `LossScaleOptimizer` or a
        `MultiOptimizer` too).
      variables: the model variables it should update from now on.
      fresh: variables among them whose state starts afresh even if the
        optimizer has some (they learn again after a frozen spell).

    Returns:
      True if the optimizer's variables changed (a compiled step that uses it
      must be traced again), False if it already was built for `variables`.

    Raises:
      RuntimeError: if the optimizer keeps per-variable state in a form this
        cannot map (nothing is changed then).

    Example:

    >>> import keras
    >>> from maskfit.optim import rebuild as rebuild_lib
    >>> a, b = keras.Variable([1.0, 2.0]), keras.Variable([3.0])
    >>> optimizer = keras.optimizers.Adam()
    >>> rebuild_lib.rebuild(optimizer, [a])
    True
    >>> rebuild_lib.rebuild(optimizer, [a, b])
    True
    >>> [tuple(v.shape) for v in rebuild_lib.built_variables(optimizer)]
    [(2,), (1,)]
    """
    variables = list(variables)
    if not optimizer.built:
        optimizer.build(variables)
        return True
    before = built_variables(optimizer)
    fresh_ids = {id(v) for v in fresh}
    if [id(v) for v in before] == [id(v) for v in variables]:
        restart(optimizer, [v for v in variables if id(v) in fresh_ids])
        return False
    kept = {id(v) for v in before} - fresh_ids
    old = [
        internals.optimizer_state(each)
        for each in internals.optimizers_within(optimizer)
    ]
    snapshot = internals.OptimizerStructure(optimizer)
    internals.reset_optimizer(optimizer)
    optimizer.build(variables)
    new = [
        internals.optimizer_state(each)
        for each in internals.optimizers_within(optimizer)
    ]
    if len(new) != len(old) or any(
        [tuple(v.shape) for v in o[1]] != [tuple(v.shape) for v in n[1]]
        for o, n in zip(old, new)
    ):
        snapshot.restore()
        raise RuntimeError(
            f"maskfit cannot rebuild optimizer '{optimizer.name}' for a new set of"
            " variables: its own state changed shape with the variables, so its"
            " per-variable state cannot be mapped. Freeze with masks that are not"
            " all zero, or use another optimizer."
        )
    for (old_slots, old_own), (new_slots, new_own) in zip(old, new):
        for key, slot in new_slots.items():
            if key in old_slots and key[1] in kept:
                slot.assign(old_slots[key])
        for old_variable, new_variable in zip(old_own, new_own):
            new_variable.assign(old_variable)
    _start_new_averages(optimizer, [v for v in variables if id(v) not in kept])
    return True


def restart(optimizer, variables):
    """Puts the state `optimizer` has for `variables` back to a fresh build's."""
    if not variables:
        return
    clone = type(optimizer).from_config(optimizer.get_config())
    clone.build(variables)
    for mine, theirs in zip(
        internals.optimizers_within(optimizer), internals.optimizers_within(clone)
    ):
        slots, _ = internals.optimizer_state(mine)
        for key, value in internals.optimizer_state(theirs)[0].items():
            if key in slots:
                slots[key].assign(value)
    _start_new_averages(optimizer, variables)


def _start_new_averages(optimizer, new_variables):
    """Starts each new variable's EMA average at its value.

    As a fresh optimizer's first step does.
    """
    if not new_variables:
        return
    for each in internals.optimizers_within(optimizer):
        averages = internals.ema_averages_by_variable(each)
        for variable in new_variables:
            average = averages.get(id(variable))
            if average is not None:
                average.assign(
                    tf.cast(keras.ops.convert_to_tensor(variable), average.dtype)
                )
