"""The guarded update: snapshot, `optimizer.apply`, then put frozen entries back.

Every Keras optimizer but plain SGD can move an entry whose gradient is 0
(weight decay, momentum, Adam's history, EMA overwrite, constraints), so an
entry whose mask is 0 is kept exact by a snapshot taken just before the
update and put back just after it (its EMA average too); an entry a rule
dropped is set to +0.0 instead. `guards` decides, per variable, which of
those the step needs; `snapshot` and `restore` do them, in the step;
`pinned` does the same for whole variables (those `maskfit.apply_gradients`
leaves out). They are pure functions of the mask state they are given.
"""

import collections

import tensorflow as tf

from maskfit import internals
from maskfit.optim import traits
from maskfit.optim.rates import scaled_learning_rates
from maskfit.paths import handle as variable_handle
from maskfit.step import mask_state
from maskfit.step import plan as plan_lib

__all__ = ["Guard", "apply_guarded", "guards", "pinned", "restore", "snapshot"]


class Guard(collections.namedtuple("Guard", ["index", "dynamic", "restores"])):
    """What the update does for one masked variable besides `optimizer.apply`.

    Attributes:
      index: the variable's position in the step.
      dynamic: whether the snapshot is taken only when the mask in force has
        a 0 (decided in the step), else always.
      restores: whether frozen entries are put back from a snapshot; False
        when only a rule's dropped entries are set to 0 (no snapshot).
    """


def guards(step_plan, masks, optimizer, variables, masked, static, fuse, zeroed):
    """The `Guard`s of one update, for the masked variables the step updates.

    Args:
      step_plan: the step's `StepPlan`.
      masks: `{position: VariableMasks}` of the masked variables.
      optimizer: the step's optimizer.
      variables: the step's variables, in its order.
      masked: whether the gradients reaching `apply` are exactly the masked
        ones; when they may have been transformed after masking, every
        masked variable is snapshotted and restored, whatever the optimizer.
      static: True under XLA, where a snapshot taken only when needed cannot
        be expressed: one is always taken (XLA fuses it into the update).
      fuse: whether the update is compiled with XLA (then static too).
      zeroed: positions whose dropped entries had their optimizer state set
        to 0 when dropped (`traits.keeps_dropped_entries_at_zero`): with
        masked gradients they stay 0 by themselves, and need no zeroing.
    """
    found = []
    for i, entry in masks.items():
        if i in step_plan.frozen:
            continue
        mode = step_plan.guarded[i]
        restores = entry.state is not None and (
            not masked
            or (
                mode != plan_lib.NEVER
                and traits.moves_zero_gradient_entries(optimizer, variables[i])
            )
        )
        dynamic = masked and mode == plan_lib.SOMETIMES and not (static or fuse)
        zeroes = entry.keep is not None and not (masked and i in zeroed)
        if restores or zeroes:
            found.append(Guard(i, dynamic and restores, restores))
    return found


def snapshot(variable, entry, dynamic):
    """The variable's value before the update; under a dynamic guard, only if needed.

    Returns `(needed, value)`: `needed` is None for a snapshot always taken,
    else a boolean tensor (the mask in force has a 0); `value` is then an
    empty tensor when not needed, so nothing is copied.
    """
    handle = variable_handle(variable)
    if not dynamic:
        return None, tf.identity(handle)
    needed = tf.reduce_any(mask_state.is_frozen(entry.declared(entry.state.current)))
    value = tf.cond(
        needed,
        lambda: tf.identity(handle),
        lambda: tf.zeros([0], handle.dtype),
    )
    return needed, value


def restore(optimizer, variables, snapshots, masks):
    """Puts back the frozen entries from `snapshots`, zeroes the dropped ones.

    Each variable's EMA average gets the same. Runs once per variable in
    cross-replica context (under a strategy, on every replica's copy).

    Args:
      optimizer: the optimizer that just updated `variables`.
      variables: the guarded variables.
      snapshots: per variable, `(needed, value)` from `snapshot`, or None
        when only its dropped entries (a rule's) are to be zeroed.
      masks: per variable, its `VariableMasks`, or None to put the whole
        variable back (see `pinned`).
    """
    averages = traits.ema_averages(optimizer, variables)
    targets = [variable_handle(v) for v in variables]

    def restore_all(distribution, snapshots):
        for target, taken, entry, average in zip(targets, snapshots, masks, averages):
            needed, value = (None, None) if taken is None else taken
            # What the per-replica restore reads: the snapshot and the
            # declared mask (if restored), the keep mask (if a rule's).
            args = () if value is None else (value,)
            if value is not None and entry is not None:
                args += (entry.state.current,)
            keep = None if entry is None else entry.keep
            args += () if keep is None else (keep,)

            def put_back(
                target, *values, entry=entry, needed=needed, restores=value is not None
            ):
                def assign():
                    new = tf.convert_to_tensor(target)
                    if restores:
                        kept = tf.reshape(values[0], tf.shape(new))
                        if entry is None:
                            new = kept
                        else:
                            frozen = mask_state.is_frozen(entry.declared(values[1]))
                            new = tf.where(frozen, kept, new)
                    if entry is not None and entry.keep is not None:
                        new = mask_state.where_masked(new, values[-1])
                    return target.assign(new)

                if needed is None:
                    return assign()

                def assign_if_needed():
                    with tf.control_dependencies([assign()]):
                        return tf.constant(True)

                return tf.cond(needed, assign_if_needed, lambda: tf.constant(False))

            for variable in (target, average):
                if variable is not None:
                    distribution.extended.update(
                        variable_handle(variable), put_back, args=args, group=False
                    )

    internals.merge_call(restore_all, tf.distribute.get_strategy(), snapshots)


def apply_guarded(optimizer, gradients, variables, updated, guarded, masks, rates=()):
    """`optimizer.apply` on `updated`, between the snapshots and restores of `guarded`.

    Args:
      optimizer: the step's optimizer.
      gradients: one gradient (or None) per variable of `updated`.
      variables: the step's variables, in its order.
      updated: the variables the optimizer updates (the frozen ones left out).
      guarded: the `Guard`s of the update (`guards`).
      masks: `{position: VariableMasks}`.
      rates: `(variable, multiplier)` pairs: those variables are stepped at
        the learning rate x multiplier (`maskfit.optim.rates`).
    """
    snapshots = [
        snapshot(variables[g.index], masks[g.index], g.dynamic) if g.restores else None
        for g in guarded
    ]
    with scaled_learning_rates(optimizer, rates):
        optimizer.apply(gradients, updated)
    if guarded:
        restore(
            optimizer,
            [variables[g.index] for g in guarded],
            snapshots,
            [masks[g.index] for g in guarded],
        )


class pinned:
    """A context in which `variables` (and their EMA averages) cannot move.

    `maskfit.apply_gradients` leaves variables out of an update (no gradient,
    or not passed), but an optimizer with EMA overwrite still moves them;
    this puts them back, as the masked step does for frozen entries.

    Example:

    >>> import keras
    >>> v = keras.Variable([1.0])
    >>> with pinned(keras.optimizers.SGD(), [v]):
    ...     v.assign([2.0])
    >>> float(v.numpy()[0])
    1.0
    """

    def __init__(self, optimizer, variables):
        self._optimizer = optimizer
        self._variables = list(variables)
        self._snapshots = None

    def __enter__(self):
        self._snapshots = [snapshot(v, None, False) for v in self._variables]
        return self

    def __exit__(self, *exc_info):
        if exc_info[0] is None and self._variables:
            restore(
                self._optimizer,
                self._variables,
                self._snapshots,
                [None] * len(self._variables),
            )
        return False
