"""What an optimizer does to an entry whose gradient is 0: the traits masks rely on.

- `moves_zero_gradient_entries`: whether a frozen entry needs a snapshot and
  a restore around the update (every optimizer but plain SGD).
- `keeps_dropped_entries_at_zero` / `state_of`: which optimizers keep a
  dropped entry (a rule's, e.g. pruning) at +0 on their own once its state
  is 0, and that state.
- `ema_averages`: each variable's EMA average, which a restore must pin too.
- `inner`: the optimizer that runs the update (inside loss scaling).

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

import keras
import numpy as np
import tensorflow as tf

from maskfit import checks, internals, paths

__all__ = [
    "ema_averages",
    "inner",
    "keeps_dropped_entries_at_zero",
    "moves_zero_gradient_entries",
    "fresh_state",
    "state_of",
    "zeroable_state",
]

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


def inner(optimizer):
    """The optimizer that runs the update: a `LossScaleOptimizer`'s inner one, else itself."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def moves_zero_gradient_entries(optimizer, variable):
    """Whether `optimizer` can move an entry of `variable` whose gradient is 0.

    Only plain SGD (no momentum, weight decay, clipping, EMA) on a variable
    without a constraint is known to leave such entries bit-identical; every
    other optimizer (a `MultiOptimizer` too) gets a snapshot and restore
    around its update.
    """
    updater = inner(optimizer)
    if type(updater) is not keras.optimizers.SGD:
        return True
    settings = (
        updater.momentum,
        updater.weight_decay,
        updater.use_ema,
        updater.clipnorm,
        updater.clipvalue,
        updater.global_clipnorm,
    )
    return any(settings) or variable.constraint is not None


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
    >>> from maskfit.optim import traits
    >>> v = keras.Variable([1.0, 0.0])
    >>> traits.keeps_dropped_entries_at_zero(keras.optimizers.Adam(), v)
    True
    >>> traits.keeps_dropped_entries_at_zero(keras.optimizers.Adam(epsilon=0.0), v)
    False
    """
    updater = inner(optimizer)
    if type(updater) not in _ELEMENTWISE or variable.constraint is not None:
        return False
    epsilon = getattr(updater, "epsilon", 1.0)
    return checks.is_real(epsilon) and epsilon > 0


def state_of(optimizer, variable):
    """Returns every per-variable state `optimizer` keeps for `variable`.

    Slots (momentum, Adam's moments...), accumulated gradients and the EMA
    average, in a fixed order; [] while the optimizer is not built (a fresh
    build starts them at 0, or for Adagrad at a value a 0 gradient never
    uses).
    """
    found = []
    for each in internals.optimizers_within(optimizer):
        found += _own_state(each, variable)
    return found


def _own_state(optimizer, variable):
    """The per-variable state one optimizer (not those it wraps) keeps for `variable`."""
    if not optimizer.built:
        return []
    slots, _ = internals.optimizer_state(optimizer)
    return [
        slot
        for (_, owner), slot in sorted(slots.items(), key=lambda item: item[0][0])
        if owner == id(variable)
    ]


def fresh_state(optimizer, variable, values=None):
    """`[(state variable, fresh value)]` for every per-variable state of `variable`.

    The fresh value is what a new optimizer of the same configuration starts
    that state at (a clone built for a variable of the same shape, read
    once): 0 for momentum and Adam's moments, `initial_accumulator_value`
    for Adagrad and Ftrl, the variable's own value (0 for an entry that
    grows back) for an EMA average. A value that is the same for every entry
    is kept as a scalar. Call it outside the compiled step.

    Args:
      optimizer: a built Keras optimizer.
      variable: one of the variables it was built with.
      values: None, or the values of `optimizer.variables` (a stateless
        step's, under JAX, where `fit` leaves the variables without values),
        read in place of the variables; the state is then given as Keras
        variables, not their `tf.Variable`s.

    Raises:
      ValueError: when a state variable does not have `variable`'s shape
        (Adafactor's factored second moments are shared by a whole row or
        column), so one entry's state cannot start afresh alone.
    """
    found = []
    for each in internals.optimizers_within(optimizer):
        mine = _own_state(each, variable)
        if not mine:
            continue
        with tf.init_scope():
            probe = keras.Variable(
                np.zeros(tuple(variable.shape)), dtype=variable.dtype, trainable=True
            )
            clone = type(each).from_config(_config(each, optimizer, values))
            clone.build([probe])
            fresh = _own_state(clone, probe)
            for state, start in zip(mine, fresh):
                if tuple(state.shape) != tuple(variable.shape):
                    raise ValueError(
                        f"Optimizer '{each.name}' ({type(each).__name__}) keeps state"
                        f" '{state.path}' of shape {tuple(state.shape)} for variable"
                        f" '{variable.path}' of shape {tuple(variable.shape)}: entries"
                        " share it, so an entry that grows back cannot start with"
                        " fresh state. Use an optimizer whose state has the"
                        " variable's shape (Adam, AdamW, SGD, ...) with a rule that"
                        " regrows entries."
                    )
                value = np.asarray(keras.ops.convert_to_numpy(start))
                if value.size and np.all(value == value.flat[0]):
                    value = value.flat[0]
                found.append((state if values else paths.handle(state), value))
    return found


def _config(each, optimizer, values):
    """`each.get_config()`, the variables of `optimizer` read from `values` if given."""
    if values is None:
        return each.get_config()
    mapping = list(zip(optimizer.variables, values))
    with keras.StatelessScope(state_mapping=mapping):
        return each.get_config()


def zeroable_state(optimizer, variables, positions):
    """`{position: [state tf.Variables]}` for those of `positions` (in `variables`)
    whose dropped entries `optimizer` keeps at 0 by itself, once their state is 0."""
    return {
        i: [paths.handle(v) for v in state_of(optimizer, variable)]
        for i, variable in enumerate(variables)
        if i in positions and keeps_dropped_entries_at_zero(optimizer, variable)
    }


def ema_averages(optimizer, variables):
    """Returns each variable's EMA average in `optimizer`, or None per variable.

    Searches every optimizer within (loss scaling, a `MultiOptimizer`'s
    sub-optimizers). A frozen entry's average is pinned to its value so that
    `finalize_variable_values` at the end of `fit` (which copies the averages
    into the model) cannot move it.
    """
    averages = {}
    for each in internals.optimizers_within(optimizer):
        averages.update(internals.ema_averages_by_variable(each))
    return [averages.get(id(v)) for v in variables]
