"""Which units stay: scores per atom, kept counts per group, keep masks per variable.

`UnitPlan` holds, for a `DependencyGraph`, the constant index arrays the
training step needs (the atom of each position of each sliced axis).
`choose` ranks atoms inside each group (or across all groups, scores
divided by their group's mean, with `global_pruning`), and keeps
`kept_count` of each group; `keep_mask` expands the kept atoms onto one
variable. All of it is TensorFlow ops, run in the step at each update
(and eagerly for `select_units`).

Counting follows Torch-Pruning's `pruning_ratio`: a fraction `s` of each
group's units is removed, counted in channels of one layer (not in
parameters): `floor(C * (1 - s))` stay, rounded down to a multiple of
`round_to` when anything is removed, and at least `min_units` (rounded up
to `round_to`). A GroupNormalization group counts as its channels, and
is kept or removed whole. A count that a layer of the group would compute
wrongly with (`UnitGroup.avoid`) is stepped over: one rounding step more
stays. Atoms removed by an earlier update (`alive_atoms`) rank below all
others and never come back.
"""

import math
from typing import NamedTuple

import numpy as np
import tensorflow as tf

__all__ = ["UnitPlan", "choose", "kept_count"]


class VariablePlan(NamedTuple):
    """One variable's slices: `(axis, atom per position, scored)`; the atom is
    `num_atoms` where a position goes with no removable atom."""

    variable: object
    slices: tuple


class UnitPlan:
    """The constants of a `DependencyGraph` that choosing and masking need.

    Attributes:
      graph: the `DependencyGraph`.
      num_atoms: how many removable atoms it has.
      variables: a `VariablePlan` per trainable variable with removable
        entries, in the graph's order.
      groups: the graph's `UnitGroup`s.
    """

    def __init__(self, graph):
        self.graph = graph
        self.num_atoms = graph.num_atoms
        self.groups = graph.groups
        self.variables = []
        for entry in graph.sliced_variables(trainable=True):
            slices = []
            for axis, ids in sorted(entry.axes.items()):
                atoms = graph.atoms_of(ids)
                atoms = np.where(atoms >= 0, atoms, self.num_atoms).astype(np.int32)
                slices.append((axis, atoms, entry.scored[axis]))
            self.variables.append(VariablePlan(entry.variable, tuple(slices)))
        # By the Keras variable, and by the tf.Variable behind it (what the
        # step's rule state hands over).
        self.by_id = {}
        for each in self.variables:
            self.by_id[id(each.variable)] = each
            self.by_id[id(getattr(each.variable, "value", each.variable))] = each
        # Per group, the atoms of each layer that holds some of the group's.
        self.partial_layers = [_partial_layers(graph, g) for g in graph.groups]


def _reduce_to(values, axis):
    other = [a for a in range(len(values.shape)) if a != axis]
    return tf.reduce_sum(values, axis=other) if other else values


def atom_totals(plan, per_variable, scored_only=True):
    """Sums, per atom, the entries of `per_variable` ({id(variable): tensor}) it owns."""
    total = tf.zeros([plan.num_atoms + 1], tf.float32)
    for each in plan.variables:
        values = per_variable.get(id(each.variable))
        if values is None:
            continue
        values = tf.cast(values, tf.float32)
        for axis, atoms, scored in each.slices:
            if scored or not scored_only:
                total += tf.math.unsorted_segment_sum(
                    _reduce_to(values, axis), tf.constant(atoms), plan.num_atoms + 1
                )
    return total[: plan.num_atoms]


def kept_count(channels, per_atom, fraction, round_to=None, min_units=1):
    """How many atoms of a group stay (a scalar int32 tensor).

    Args:
      channels: the group's removable channels (atoms times `per_atom`).
      per_atom: channels per atom (1; a GroupNormalization group's size).
      fraction: the fraction of channels to remove (a scalar tensor or float).
      round_to: the kept channels are a multiple of it (when any is removed).
      min_units: at least this many channels stay.

    Example:

    >>> from maskfit.structured import unit_choice
    >>> int(unit_choice.kept_count(64, 1, 0.3, round_to=8))
    40
    """
    step = per_atom * _atom_step(per_atom, round_to)
    whole = tf.constant(channels, tf.float64)
    raw = tf.floor(whole * (1.0 - tf.cast(fraction, tf.float64)) + 1e-6)
    rounded = tf.floor(raw / step) * step
    lowest = tf.constant(
        min(math.ceil(max(min_units, 1) / step) * step, channels), tf.float64
    )
    kept = tf.where(raw >= whole, whole, tf.minimum(tf.maximum(rounded, lowest), whole))
    return tf.cast(kept, tf.int32) // per_atom


def _rank(scores):
    """Positions of `scores` from the highest; ties keep the lower position first."""
    return tf.argsort(scores, direction="DESCENDING", stable=True)


def _group_constants(group):
    per_atom = int(group.channels.max()) if len(group.channels) else 1
    uniform = bool(np.all(group.channels == per_atom))
    return per_atom, uniform


def choose(
    plan,
    scores,
    protected,
    fraction,
    global_pruning=False,
    round_to=None,
    min_units=1,
    alive=None,
):
    """Returns a bool per atom: which stay.

    Args:
      scores: a float tensor per atom (higher stays).
      protected: a bool tensor per atom: kept whatever (a `set_mask` freeze).
      fraction: the fraction of each group's channels to remove.
      global_pruning: rank all groups of channels together, each atom's
        score divided by its group's mean (Torch-Pruning's
        `global_pruning=True`); the total removed is `fraction` of all
        channels. Heads are ranked within their layer either way.
      alive: a bool tensor per atom: False for atoms already removed, which
        never come back (they rank below every other); all alive if None.
    """
    keep = tf.zeros([plan.num_atoms], tf.bool)
    if alive is not None:
        scores = tf.where(alive, scores, tf.constant(-np.inf, scores.dtype))
    removed = None
    ranked = [g for g in plan.groups if g.kind != "heads"]
    if global_pruning and ranked:
        removed = _global_removed(plan, ranked, scores, fraction)
    for group in plan.groups:
        atoms = tf.constant(group.atoms, tf.int32)
        per_atom, uniform = _group_constants(group)
        channels = int(group.channels.sum()) if uniform else len(group.atoms)
        step_round = round_to if (group.kind != "heads" and uniform) else None
        if removed is None or group.kind == "heads":
            share = fraction
        else:
            gone = tf.reduce_sum(tf.cast(tf.gather(removed, atoms), tf.float64))
            share = gone * (per_atom if uniform else 1) / channels
        kept = kept_count(
            channels, per_atom if uniform else 1, share, step_round, min_units
        )
        guarded = tf.gather(protected, atoms)
        local = tf.where(
            guarded, tf.constant(np.inf, scores.dtype), tf.gather(scores, atoms)
        )
        kept = tf.maximum(kept, tf.reduce_sum(tf.cast(guarded, tf.int32)))
        # Counts a layer of the group would compute wrongly with: one step more.
        step = _atom_step(per_atom if uniform else 1, step_round)
        for count in group.avoid:
            kept = tf.where(kept == count, kept + step, kept)
        kept = tf.minimum(kept, len(group.atoms))
        # Static shapes (XLA): each atom's place in the ranking, kept if < kept.
        place = tf.argsort(_rank(local), stable=True)
        keep = tf.tensor_scatter_nd_update(keep, atoms[:, None], place < kept)
        keep = _every_layer_keeps_one(plan, group, scores, protected, keep)
    return keep


def _every_layer_keeps_one(plan, group, scores, protected, keep):
    """Keeps the best unit of each layer of `group` that the ranking left with none.

    A layer whose units are some of the group's atoms (a branch of a
    concatenation that a residual add joins to a stream) could lose all of
    them to the group's ranking: it would be left with 0 filters.
    """
    for subset in plan.partial_layers[group.index]:
        atoms = tf.constant(subset, tf.int32)
        local = tf.where(
            tf.gather(protected, atoms),
            tf.constant(np.inf, scores.dtype),
            tf.gather(scores, atoms),
        )
        best = tf.gather(atoms, tf.argmax(local, output_type=tf.int32))[None]
        none = tf.logical_not(tf.reduce_any(tf.gather(keep, atoms)))
        kept = tf.logical_or(tf.gather(keep, best), none)
        keep = tf.tensor_scatter_nd_update(keep, best[:, None], kept)
    return keep


def _partial_layers(graph, group):
    """The atoms of each layer of `group` that holds some, not all, of its atoms."""
    found = []
    for space in group.spaces:
        atoms = graph.atoms_of(space.ids)
        atoms = np.unique(atoms[atoms >= 0])
        if 0 < len(atoms) < len(group.atoms):
            found.append(atoms.astype(np.int32))
    return found


def _atom_step(per_atom, round_to):
    """Atoms per step of `kept_count`'s rounding."""
    if not round_to:
        return 1
    return per_atom * round_to // math.gcd(per_atom, round_to) // per_atom


def _global_removed(plan, groups, scores, fraction):
    """Which atoms of `groups` the global ranking removes: lowest normalized scores first."""
    normalized = []
    weights = []
    for group in groups:
        local = tf.gather(scores, tf.constant(group.atoms, tf.int32))
        living = tf.math.is_finite(local)  # removed atoms are -inf: they go first
        mean = tf.math.divide_no_nan(
            tf.reduce_sum(tf.where(living, local, 0.0)),
            tf.reduce_sum(tf.cast(living, local.dtype)),
        )
        normalized.append(tf.where(living, tf.math.divide_no_nan(local, mean), local))
        weights.append(tf.constant(group.channels, tf.float64))
    order_atoms = tf.constant(np.concatenate([g.atoms for g in groups]), tf.int32)
    normalized = tf.concat(normalized, 0)
    weights = tf.concat(weights, 0)
    total = float(sum(int(g.channels.sum()) for g in groups))
    target = total - tf.floor(total * (1.0 - tf.cast(fraction, tf.float64)) + 1e-6)
    order = tf.argsort(normalized, stable=True)
    cumulative = tf.cumsum(tf.gather(weights, order))
    gone_sorted = cumulative <= target
    gone = tf.scatter_nd(
        tf.gather(order_atoms, order)[:, None],
        tf.cast(gone_sorted, tf.int32),
        [plan.num_atoms],
    )
    return gone > 0


def keep_mask(plan, keep, variable):
    """The keep mask of `variable` (bool, its shape) for the kept atoms `keep`."""
    each = plan.by_id[id(variable)]
    rank = len(variable.shape)
    extended = tf.concat([keep, [True]], 0)
    mask = None
    for axis, atoms, _ in each.slices:
        shape = [1] * rank
        shape[axis] = -1
        along = tf.reshape(tf.gather(extended, tf.constant(atoms)), shape)
        mask = along if mask is None else tf.logical_and(mask, along)
    return tf.broadcast_to(mask, tuple(variable.shape))


def alive_atoms(plan, keeps):
    """In the step: which atoms are not removed yet, from keep masks `{id(variable): bool}`.

    An atom is removed when none of its entries in `keeps` is kept; atoms
    without an entry there are alive.
    """
    kept = atom_totals(plan, keeps, scored_only=False)
    ones = {k: tf.ones_like(v, tf.float32) for k, v in keeps.items()}
    seen = atom_totals(plan, ones, scored_only=False)
    return tf.logical_or(kept > 0, tf.equal(seen, 0))


def kept_atoms_from(plan, keeps):
    """Which atoms stay, read from keep masks `{id(variable): bool array}`.

    An atom stays if any entry that goes with it is kept in any variable
    the masks cover; atoms without a mask stay.
    """
    seen = np.zeros(plan.num_atoms + 1, bool)
    alive = np.zeros(plan.num_atoms + 1, bool)
    for each in plan.variables:
        keep = keeps.get(id(each.variable))
        if keep is None:
            continue
        keep = np.asarray(keep, bool)
        for axis, atoms, _ in each.slices:
            other = tuple(a for a in range(keep.ndim) if a != axis)
            any_kept = keep.any(axis=other) if other else keep
            np.logical_or.at(alive, atoms, any_kept)
            seen[atoms] = True
    return (alive | ~seen)[: plan.num_atoms]
