"""The guarded update: snapshot, `optimizer.apply`, then put frozen entries back.

Every Keras optimizer but plain SGD can move an entry whose gradient is 0
(weight decay, momentum, Adam's history, EMA overwrite, constraints), so an
entry whose mask is 0 is kept exact by a snapshot taken just before the
update and put back just after it (its EMA average too); an entry a rule
dropped is set to +0.0 instead. `guards` decides, per variable, which of
those the step needs; `snapshot` and `restore` do them, in the step, and
`apply_guarded` runs them around `optimizer.apply`; `pinned` does the same
for whole variables (those `maskfit.apply_gradients` leaves out). They are
pure functions of the step's `pipeline.StepView`.
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


def guards(view, zeroed):
    """The `Guard`s of one update, for the masked variables the step updates.

    When the gradients reaching `apply` may have been transformed after
    masking (`view.mode.custom_masking`), every variable with a declared
    mask is snapshotted and restored, whatever the optimizer. Under XLA (a
    `STATIC` or `FUSED` mode) a snapshot taken only when needed cannot be
    expressed: one is always taken (XLA fuses it into the update).

    Args:
      view: the step's `pipeline.StepView`.
      zeroed: positions whose dropped entries had their optimizer state set
        to 0 when dropped (`traits.keeps_dropped_entries_at_zero`): with
        masked gradients they stay 0 by themselves, and need no zeroing.
    """
    found = []
    exact = view.mode.exact
    for i, mask in view.masks.items():
        restores = mask.masks.state is not None and (
            not exact
            or (
                mask.guarded != plan_lib.NEVER
                and traits.moves_zero_gradient_entries(
                    view.optimizer, view.variables[i]
                )
            )
        )
        dynamic = view.mode.dynamic and mask.guarded == plan_lib.SOMETIMES
        zeroes = mask.masks.keep is not None and not (exact and i in zeroed)
        if restores or zeroes:
            found.append(Guard(i, dynamic and restores, restores))
    return found


def snapshot(variable, frozen, dynamic):
    """The variable's value before the update; under a dynamic guard, only if needed.

    Args:
      variable: the variable.
      frozen: where its declared mask freezes an entry (`MaskOfStep.frozen`);
        read only when `dynamic`.
      dynamic: whether to take the snapshot only if `frozen` has a True.

    Returns `(needed, value)`: `needed` is None for a snapshot always taken,
    else a boolean tensor (the mask in force has a 0); `value` is then an
    empty tensor when not needed, so nothing is copied.
    """
    handle = variable_handle(variable)
    if not dynamic:
        return None, tf.identity(handle)
    needed = tf.reduce_any(frozen)
    value = tf.cond(
        needed,
        lambda: tf.identity(handle),
        lambda: tf.zeros([0], handle.dtype),
    )
    return needed, value


def restore(optimizer, variables, snapshots, masks):
    """Puts back the frozen entries from `snapshots`, zeroes the dropped ones.

    Each variable's EMA average gets the same. Runs once per variable in
    cross-replica context; under a strategy, each replica's copy is
    restored from that replica's snapshot and mask.

    Args:
      optimizer: the optimizer that just updated `variables`.
      variables: the guarded variables.
      snapshots: per variable, `(needed, value)` from `snapshot`, or None
        when only its dropped entries (a rule's) are to be zeroed.
      masks: per variable, its `pipeline.MaskOfStep`, or None to put the
        whole variable back (see `pinned`).
    """
    averages = traits.ema_averages(optimizer, variables)
    targets = [variable_handle(v) for v in variables]
    # Read in the replicas, so through the merge call: each its own.
    frozen = [
        None if mask is None or taken is None else mask.frozen
        for mask, taken in zip(masks, snapshots)
    ]

    def restore_all(distribution, snapshots, frozen):
        for target, taken, mask, where, average in zip(
            targets, snapshots, masks, frozen, averages
        ):
            needed, value = (None, None) if taken is None else taken
            whole = mask is None
            keep = None if whole else mask.masks.keep
            # What the per-replica restore reads: the snapshot and where the
            # declared mask freezes (if restored), the keep mask (if a rule's).
            args = () if value is None else (value,)
            if value is not None and not whole:
                args += (where,)
            args += () if keep is None else (keep,)

            def put_back(
                target,
                *values,
                whole=whole,
                keeps=keep is not None,
                needed=needed,
                restores=value is not None,
            ):
                def assign():
                    new = tf.convert_to_tensor(target)
                    if restores:
                        kept = tf.reshape(values[0], tf.shape(new))
                        new = kept if whole else tf.where(values[1], kept, new)
                    if keeps:
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

    internals.merge_call(restore_all, tf.distribute.get_strategy(), snapshots, frozen)


def _learning_rate_multipliers(view):
    """`(variable, multiplier)` of the variables whose mask scales the learning rate.

    Values other than 0 and 1 of a `scale="step"` mask multiply the learning
    rate. The multiplier is a function read in the update, on each replica's
    device (`maskfit.optim.rates`), so it reads the mask's state there.
    """
    return [
        (view.variables[i], lambda m=mask.masks: m.expand(m.state.current))
        for i, mask in view.masks.items()
        if mask.scaled != plan_lib.NEVER
    ]


def apply_guarded(view, gradients, guarded):
    """`optimizer.apply` on the step's variables, between the snapshots and restores.

    Args:
      view: the step's `pipeline.StepView`.
      gradients: one gradient (or None) per variable the step updates
        (`view.active`).
      guarded: the `Guard`s of the update (`guards`).
    """
    variables = view.variables
    snapshots = []
    for g in guarded:
        frozen = view.masks[g.index].frozen if g.dynamic else None
        taken = snapshot(variables[g.index], frozen, g.dynamic) if g.restores else None
        snapshots.append(taken)
    with scaled_learning_rates(view.optimizer, _learning_rate_multipliers(view)):
        view.optimizer.apply(gradients, view.active(variables))
    if guarded:
        restore(
            view.optimizer,
            [variables[g.index] for g in guarded],
            snapshots,
            [view.masks[g.index] for g in guarded],
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
        self._snapshots = [snapshot(v, None, dynamic=False) for v in self._variables]
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
