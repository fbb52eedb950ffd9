"""A rule's update inside the step: new keep masks, dropped and regrown entries.

`apply` runs, for each rule of a `RuleRun` that updates at the step, its
`keep_masks` on every covered variable at once, then assigns the keep masks,
sets the dropped weights (and the optimizer state listed for them) to +0.0,
and gives the entries a regrowing rule keeps again a fresh optimizer's state.
`start` sets the keep masks a rule starts from. `RuleKeeps` holds the keep
masks; `maskfit.step.rules.runner` says which rules run where and calls this.
"""

import collections

import keras
import numpy as np
import tensorflow as tf

from maskfit import internals
from maskfit.paths import handle
from maskfit.step import mask_state

__all__ = ["RuleRun", "apply", "initial_masks", "start"]


def _as_keep(mask):
    """`mask` (bool or 0/1 numbers) as a bool tensor."""
    mask = tf.convert_to_tensor(mask)
    return mask if mask.dtype == tf.bool else tf.not_equal(mask, 0)


class RuleRun(
    collections.namedtuple(
        "RuleRun", ["only", "zeroed_state", "fresh", "gradients"], defaults=(None,)
    )
):
    """Which rules one `apply` runs, and the optimizer state it touches.

    Attributes:
      only: positions in the `RuleKeeps`'s groups of the rules to run.
        Called eagerly (outside the step) `apply` runs them at once.
      zeroed_state: `{position: [variables of its shape]}`, the optimizer
        state whose dropped entries are set to 0 with the weights
        (`maskfit.optim.traits.zeroable_state`).
      fresh: `{position: [(state variable, fresh value)]}` for the variables
        of rules that regrow (`maskfit.optim.traits.fresh_state`).
      gradients: one gradient (or None) per variable of the step, for the
        rules that `uses_gradients` (summed over replicas for them); None.
    """


def apply(keeps, view, run):
    """Runs each rule of `run.only` that updates at the view's step (traced once).

    A rule that updates gets new keep masks for its variables (all of
    them computed before any is assigned), the weights it drops are set
    to +0.0 with the optimizer state of `run.zeroed_state`, and the
    entries it grows back (a rule that `regrows`) get the fresh state of
    `run.fresh`. Entries a declared mask freezes are never dropped. Under
    a distribution strategy this runs in cross-replica context: every
    replica gets the same masks.

    Args:
      keeps: the step's `RuleKeeps` (its groups and keep masks).
      view: the step's `pipeline.StepView` (its step a tensor, or an int
        outside the step); variables it leaves out are not updated.
      run: the `RuleRun`.
    """
    state = run.zeroed_state or {}
    fresh = run.fresh or {}
    gradients = run.gradients
    groups = [
        (group.rule, [i for i in group.indices if i not in view.left_out])
        for number, group in enumerate(keeps.groups)
        if number in run.only
    ]
    groups = [(rule, indices) for rule, indices in groups if indices]
    if not groups:
        return
    variables = [handle(v) for v in view.variables]
    step = view.step

    def entries_of(indices):
        return [(variables[i], i, _frozen(view, i), state.get(i, ())) for i in indices]

    def apply_all(distribution, gradients):
        value = step.value if isinstance(step, keras.Variable) else step
        current_step = tf.cast(tf.convert_to_tensor(value), tf.int64)
        xla = internals.tracing_for_xla()
        for rule, indices in groups:
            if xla:
                own = [gradients[i] for i in indices] if rule.uses_gradients else None
                _update_group_outside_cond(
                    keeps,
                    distribution,
                    rule,
                    current_step,
                    entries_of(indices),
                    own,
                    fresh,
                )
                continue

            def update(rule=rule, indices=indices):
                summed = None
                if rule.uses_gradients:
                    summed = [_summed(distribution, gradients[i]) for i in indices]
                ops = _update_group(
                    keeps,
                    distribution,
                    rule,
                    current_step,
                    entries_of(indices),
                    summed,
                    fresh,
                )
                with tf.control_dependencies(ops):
                    return tf.constant(True)

            tf.cond(
                rule.should_update(current_step), update, lambda: tf.constant(False)
            )

    internals.merge_call(apply_all, tf.distribute.get_strategy(), gradients)


def _frozen(view, index):
    """Where the declared mask of variable `index` freezes an entry, or None."""
    mask = view.masks.get(index)
    return None if mask is None else mask.frozen


def _update_group(keeps, distribution, rule, step, entries, gradients, fresh):
    """New keep masks for one rule's variables; the weights they drop (and their
    state) set to +0.0, the entries they grow back given fresh state.

    Every keep mask is computed (`rule.keep_masks`, from every variable's
    value, read once for all replicas) before any is assigned or any
    weight dropped.

    Args:
      entries: `(variable, position, frozen or None, state)` per variable:
        `frozen` where its declared mask freezes an entry.
      gradients: the variables' summed gradients, or None.
      fresh: as for `apply`.

    Returns:
      The ops that assign the keep masks, drop and regrow.
    """
    olds = [tf.convert_to_tensor(keeps.by_index[e[1]]) for e in entries]
    kept = _new_keeps(keeps, rule, step, entries, gradients)
    return _assign(keeps, distribution, rule, entries, olds, kept, fresh)


def _update_group_outside_cond(
    keeps, distribution, rule, step, entries, gradients, fresh
):
    """`_update_group` for a step compiled with XLA: only the keep masks in the cond.

    XLA passes whatever a conditional's branch may write through it as
    operands and results, in every step: with the drop and the regrowth in
    the branch, the kernels and their optimizer state go through it in every
    step, out of the optimizer's fused update and back. Here the branch
    returns only the new keep masks (the current ones when the rule does
    not update), and the drop and the regrowth run in every step, outside
    it: an elementwise select per variable and state tensor, which changes
    nothing where the keep masks did not.

    Args:
      gradients: the variables' gradients (per replica), or None; summed
        over the replicas inside the branch, at update steps only.
    """

    def updated():
        summed = None
        if gradients is not None:
            summed = [_summed(distribution, g) for g in gradients]
        return tuple(_new_keeps(keeps, rule, step, entries, summed))

    olds = [tf.convert_to_tensor(keeps.by_index[e[1]]) for e in entries]
    kept = tf.cond(rule.should_update(step), updated, lambda: tuple(olds))
    return _assign(keeps, distribution, rule, entries, olds, list(kept), fresh)


def _new_keeps(keeps, rule, step, entries, gradients):
    """The new keep masks of one rule's variables (bool tensors), all computed
    before any is assigned: `rule.keep_masks`, the entries a declared mask
    freezes kept, and the current masks where the step's gradients are not
    finite."""
    weights, protected = [], []
    for variable, index, frozen, _ in entries:
        value = tf.convert_to_tensor(variable)
        guarded = None
        if frozen is not None:
            # Entries the declared mask freezes (and that are kept) stay.
            guarded = tf.logical_and(
                tf.broadcast_to(frozen, tf.shape(value)),
                tf.convert_to_tensor(keeps.by_index[index]),
            )
        weights.append(value)
        protected.append(guarded)
    current = [tf.convert_to_tensor(keeps.by_index[e[1]]) for e in entries]
    kept = list(
        rule.keep_masks(
            step,
            [e[0] for e in entries],
            weights,
            protected,
            keeps=current,
            gradients=gradients,
        )
    )
    if len(kept) != len(entries):
        raise ValueError(
            f"{type(rule).__name__}.keep_masks returned {len(kept)} masks for"
            f" {len(entries)} variables; it must return one per variable."
        )
    finite = None
    if gradients is not None:
        # A loss-scale overflow (the optimizer skipped this step): no update.
        finite = tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(g)) for g in gradients if g is not None]
        )
    new = []
    for (_, index, _, _), keep, guarded in zip(entries, kept, protected):
        keep = _as_keep(keep)
        if guarded is not None:
            keep = tf.logical_or(keep, guarded)
        if finite is not None:
            keep = tf.where(finite, keep, tf.convert_to_tensor(keeps.by_index[index]))
        new.append(keep)
    return new


def _assign(keeps, distribution, rule, entries, olds, kept, fresh):
    """Assigns the keep masks `kept`; the weights (and state) they drop set to
    +0.0, the entries they grow back (`kept` but not `olds`) given fresh state.

    Returns:
      The ops.
    """

    def assign(target, value):
        return target.assign(value)

    def drop(target, keep):
        return target.assign(mask_state.where_masked(target, keep))

    def regrow(target, grown, value):
        return target.assign(tf.where(grown, tf.cast(value, target.dtype), target))

    ops = []
    for (variable, index, _, state), keep, old in zip(entries, kept, olds):
        keep_variable = keeps.by_index[index]
        grown = None
        if rule.regrows:
            grown = tf.logical_and(keep, tf.logical_not(old))
        ops += tf.nest.flatten(
            distribution.extended.update(
                keep_variable, assign, args=(keep,), group=False
            )
        )
        for target in (variable,) + tuple(state):
            ops += tf.nest.flatten(
                distribution.extended.update(target, drop, args=(keep,), group=False)
            )
        for target, value in fresh.get(index, ()) if grown is not None else ():
            ops += tf.nest.flatten(
                distribution.extended.update(
                    target, regrow, args=(grown, value), group=False
                )
            )
    return ops


def _summed(distribution, gradient):
    """A gradient (dense), summed over the replicas of `distribution`."""
    if gradient is None:
        return None
    if distribution.num_replicas_in_sync > 1:
        gradient = distribution.reduce(tf.distribute.ReduceOp.SUM, gradient, axis=None)
    return tf.convert_to_tensor(gradient)


def initial_masks(group, variables, frozen):
    """A rule's `initial_keep_masks`, checked: `{position: bool array}`, or None.

    Each mask has its variable's shape, and keeps what `frozen` (`{position:
    bool array}`, where a declared mask freezes entries) freezes. Run on the
    host, by the TensorFlow step (`start`) and the JAX one
    (`maskfit.backend.jax_rules`).

    Raises:
      ValueError: naming the rule, the layer and the variable, when the rule
        returns another number of masks than it covers variables, or a mask
        of another shape.
    """
    covered = [variables[i] for i in group.indices]
    initial = group.rule.initial_keep_masks(
        covered, [frozen.get(i) for i in group.indices]
    )
    if initial is None:
        return None
    initial = list(initial)
    if len(initial) != len(covered):
        raise ValueError(
            f"{type(group.rule).__name__}.initial_keep_masks returned {len(initial)}"
            f" masks for {len(covered)} variables of layer '{group.layer.name}'; it"
            " must return one per variable."
        )
    masks = {}
    for index, variable, mask in zip(group.indices, covered, initial):
        mask = np.asarray(mask, bool)
        if mask.shape != tuple(variable.shape):
            raise ValueError(
                f"{type(group.rule).__name__}.initial_keep_masks returned a mask of"
                f" shape {mask.shape} for variable '{variable.path}' of shape"
                f" {tuple(variable.shape)}."
            )
        if frozen.get(index) is not None:
            mask = mask | np.broadcast_to(frozen[index], mask.shape)
        masks[index] = mask
    return masks


def start(group, keeps, variables, frozen):
    """Assigns a rule's `initial_keep_masks` (if any) to its new keep masks."""
    masks = initial_masks(group, variables, frozen)
    for index, mask in (masks or {}).items():
        keeps[index].assign(mask)
