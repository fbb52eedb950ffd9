"""Mask rules run on the host at their update steps: the backend-neutral part.

Before the step of optimizer step `s` where a rule updates (`should_update`,
tabled once per 1024 steps), its `keep_masks` (the function the TensorFlow
step runs) is called on the host: as a `tf.function` when it traces
(TensorFlow ops), else eagerly with NumPy arrays (`keras.ops`; `MaskRule`
says what it is given). Entries a declared mask freezes are protected, as
there. The dropped weights are set to +0.0 and the keep masks joined to the
step's `StatelessMasks`: a dropped entry is frozen, it and its optimizer
slots held bit for bit by every later step. Entries a rule that `regrows`
keeps again start at +0.0 with a fresh optimizer's state
(`maskfit.optim.traits.fresh_state`).

A rule that `uses_gradients` (RigL) updates after its step's update, from
the updated weights and the dense gradients. `initial_keep_masks` apply
before the first step, unless the model holds keep masks. Keep masks live in
the model's lifecycle (`pending_keeps`, by variable key), where saving reads
them and loading puts them. Past the rules' last update step nothing runs on
the host but the step.

`HostRules` works on a step's state, `(trainable values, non-trainable
values, optimizer values, ...)`, as the JAX step holds it; the JAX backend
(`maskfit.backend.jax_rules`) and the torch one (`maskfit.backend.torch_rules`)
each say how a value is written and how the masks are joined.
"""

import keras
import numpy as np
import tensorflow as tf

from maskfit import paths
from maskfit.model import training
from maskfit.optim import traits
from maskfit.spec import rules
from maskfit.step import stateless
from maskfit.step.rules import update as update_lib

__all__ = ["HostRules", "join_keeps"]


class HostRules:
    """The mask rules of one model's JAX or torch step, run on the host at their update steps.

    Args:
      model: a `MaskedModel` whose rules the JAX or torch backend runs.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = pruning.prune_low_magnitude(
    ...     keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    >>> len(HostRules(model).groups)
    1

    A backend gives three hooks: `_numpy(value)` (a value of the state on
    the host), `_where(keep, value, other)` (a value of the state with
    `other` where `keep` is False) and `_join(masks, keeps, values)`
    (`masks` with the keep masks joined, as its step takes them).
    """

    def __init__(self, model):
        self.model = model
        self.variables = list(model.trainable_variables)
        self.groups = rules.resolve_rules(rules.layer_rules(model), self.variables)
        every = training.all_trainable_variables(model)
        key_of = dict(zip(map(id, every), paths.variable_keys(model, every)))
        self.keys = [key_of[id(v)] for v in self.variables]
        lasts = [rules.last_update_of(group) for group in self.groups]
        self.last = None if None in lasts else max(lasts, default=-1)
        # (key, joined masks, and what the key's ids are of, kept alive)
        self._joined = (None, None, None, None)
        self._chunk = (None, None)  # (first step, [bool array per group])
        self._started = False
        self._fresh = {}  # position -> [(optimizer value index, fresh value)]
        self._compiled = {}  # id(rule) -> its keep_masks as a tf.function, or False

    def keeps(self):
        """`{position: bool array}`: the keep masks in force (loaded or computed)."""
        pending = self.model._maskfit_lifecycle().pending_keeps
        return {
            i: pending[self.keys[i]]
            for group in self.groups
            for i in group.indices
            if self.keys[i] in pending
        }

    def before_step(self, state, masks, step):
        """`(state, masks)` for the compiled step at optimizer step `step` (an int)."""
        if not self._started:
            state = self._start(state, masks, step)
        if self.last is None or step <= self.last:
            due = [g for g in self._due(step) if not g.rule.uses_gradients]
            if due:
                state = self._update(due, state, masks, step, None)
        return state, self.joined(masks, state[0])

    def joined(self, masks, values=None):
        """`masks` with the keep masks in force joined (cached while neither
        changes), laid out like the variables' `values` where given."""
        # `pending_keeps` is a new dict whenever a keep mask changes.
        pending = self.model._maskfit_lifecycle().pending_keeps
        key = (id(masks), id(pending))
        if self._joined[0] != key:
            joined = self._join(masks, self.keeps(), values)
            self._joined = (key, joined, masks, pending)
        return self._joined[1]

    def updating(self, step):
        """The groups whose rule updates at optimizer `step` (an int)."""
        if self.last is not None and step > self.last:
            return []
        return self._due(step)

    def needs_gradients(self, step):
        """Whether a rule that `uses_gradients` updates after the step at `step`."""
        if self.last is not None and step > self.last:
            return False
        return any(g.rule.uses_gradients for g in self._due(step))

    def after_update(self, state, masks, step, gradients):
        """The state the step at `step` returned, after the rules that
        `uses_gradients` updated from its `gradients` (one per variable);
        `masks` are the declared ones (without keep masks)."""
        due = [g for g in self._due(step) if g.rule.uses_gradients]
        return self._update(due, state, masks, step, gradients) if due else state

    def _due(self, step):
        """The groups whose rule updates at `step`, from a table of `_CHUNK` steps
        made by one compiled call of each `should_update`."""
        start = step - step % _CHUNK
        if self._chunk[0] != start:
            steps = np.arange(start, start + _CHUNK, dtype=np.int64)
            self._chunk = (start, [_updates(g, steps) for g in self.groups])
        return [g for g, due in zip(self.groups, self._chunk[1]) if due[step - start]]

    def _frozen(self, masks, step, shapes):
        """`{position: bool array}`: where the masks in force at `step` freeze entries."""
        selected = zip(masks.positions, stateless.select(masks, step))
        return {
            i: np.broadcast_to(np.asarray(value) == 0, shapes[i])
            for i, value in selected
        }

    def _start(self, state, masks, step):
        """Applies the `initial_keep_masks` of rules that have no keep masks yet."""
        self._started = True
        keeps = self.keeps()
        shapes = [tuple(v.shape) for v in self.variables]
        frozen = self._frozen(masks, step, shapes)
        new = {}
        for group in self.groups:
            if any(i in keeps for i in group.indices):
                continue
            new.update(update_lib.initial_masks(group, self.variables, frozen) or {})
        return self._assign(state, new, {}) if new else state

    def _update(self, due, state, masks, step, gradients):
        keeps = self.keeps()
        trainable = state[0]
        frozen = self._frozen(masks, step, [tuple(v.shape) for v in self.variables])
        new, grown = {}, {}
        for group in due:
            weights, protected, current = [], [], []
            for i in group.indices:
                value = self._numpy(trainable[i])
                keep = keeps.get(i, np.ones(value.shape, bool))
                guard = frozen[i] & keep if i in frozen else None
                weights.append(value)
                protected.append(guard)
                current.append(keep)
            own = None
            if group.rule.uses_gradients:
                own = [gradients[i] for i in group.indices]
                own = [None if g is None else np.asarray(g) for g in own]
                if not all(np.all(np.isfinite(g)) for g in own if g is not None):
                    continue  # a loss-scale overflow: the optimizer skipped it
            kept = self._keep_masks(
                group,
                np.int64(step),
                [self.variables[i] for i in group.indices],
                weights,
                protected,
                current,
                own,
            )
            kept = _checked(group, self.variables, list(kept))
            for i, keep, guard, old in zip(group.indices, kept, protected, current):
                new[i] = keep if guard is None else keep | guard
                if group.rule.regrows:
                    grown[i] = new[i] & ~old
        return self._assign(state, new, grown) if new else state

    def _keep_masks(self, group, step, variables, *arrays):
        """`group.rule.keep_masks`: maskfit's own rules (TensorFlow ops) as one
        `tf.function` (SET's and RigL's bisections as a graph, not op by op),
        others called eagerly with the NumPy arrays (tracing could repeat a
        side effect)."""
        rule = group.rule
        if id(rule) not in self._compiled:  # maskfit's rules: positional arguments
            own = type(rule).__module__.startswith("maskfit.")
            compiled = tf.function(lambda *a: rule.keep_masks(a[0], variables, *a[1:]))
            self._compiled[id(rule)] = own and compiled
        if self._compiled[id(rule)] is not False:
            try:
                kept = self._compiled[id(rule)](tf.constant(step), *arrays)
                return [np.asarray(m) for m in kept]
            except Exception:  # noqa: BLE001 (not traceable: called eagerly below)
                self._compiled[id(rule)] = False
        weights, protected, keeps, gradients = arrays
        return rule.keep_masks(
            step, variables, weights, protected, keeps=keeps, gradients=gradients
        )

    def _assign(self, state, new, grown):
        """`state` with keep masks `new` in force: dropped weights +0.0, `grown`
        entries +0.0 with a fresh optimizer's state."""
        lifecycle = self.model._maskfit_lifecycle()
        lifecycle.pending_keeps = {
            **lifecycle.pending_keeps,
            **{self.keys[i]: keep for i, keep in new.items()},
        }
        trainable, optimizer_values = list(state[0]), list(state[2])
        for i, keep in new.items():
            kept = keep if i not in grown else keep & ~grown[i]
            trainable[i] = self._where(kept, trainable[i], 0)
            if i in grown and grown[i].any():
                for j, value in self._fresh_of(i, optimizer_values):
                    optimizer_values[j] = self._where(
                        ~grown[i], optimizer_values[j], value
                    )
        return (trainable, state[1], optimizer_values) + tuple(state[3:])

    def _numpy(self, value):
        """A value of the state as a NumPy array (backends override)."""
        return np.asarray(value)

    def _where(self, keep, value, other):
        """`value` with `other` where `keep` is False (NumPy; backends override)."""
        return np.where(keep, value, np.asarray(other, np.asarray(value).dtype))

    def _join(self, masks, keeps, values):
        """`masks` with `keeps` joined, NumPy tables (backends override)."""
        return join_keeps(masks, keeps, np.asarray)

    def _fresh_of(self, i, values):
        """`[(position in the optimizer's values, fresh value)]` of variable `i`."""
        if i not in self._fresh:
            optimizer, variable = self.model.optimizer, self.variables[i]
            position = {id(v): j for j, v in enumerate(optimizer.variables)}
            self._fresh[i] = [
                (position[id(target)], value)
                for target, value in traits.fresh_state(optimizer, variable, values)
            ]
        return self._fresh[i]


_CHUNK = 1024


def _checked(group, variables, kept):
    """A rule's keep masks as bool arrays, one per covered variable, checked."""
    name = type(group.rule).__name__
    if len(kept) != len(group.indices):
        raise ValueError(
            f"{name}.keep_masks returned {len(kept)} masks for"
            f" {len(group.indices)} variables; it must return one per variable."
        )
    masks = []
    for i, mask in zip(group.indices, kept):
        mask = np.asarray(mask)
        shape = tuple(variables[i].shape)
        if mask.shape != shape:
            raise ValueError(
                f"{name}.keep_masks returned a mask of shape {mask.shape} for"
                f" variable '{variables[i].path}' of shape {shape}; it must return"
                " one of the variable's shape (bool, or 0/1 of any dtype)."
            )
        masks.append(mask if mask.dtype == bool else mask != 0)
    return masks


def _updates(group, steps):
    """`rule.should_update` at each of `steps` (int64), as a numpy bool array.

    One compiled call: TensorFlow's for a rule in TensorFlow ops, JAX's
    (`vmap`) for one in `keras.ops` under JAX; else called on each step as a
    NumPy int64 scalar.
    """
    rule = group.rule

    @tf.function
    def every(steps):
        return tf.map_fn(
            lambda step: tf.cast(rule.should_update(step), tf.bool),
            steps,
            fn_output_signature=tf.bool,
        )

    try:
        return every(tf.constant(steps)).numpy()
    except Exception:  # noqa: BLE001 (not TensorFlow ops: keras.ops, say)
        pass
    if keras.backend.backend() == "jax":
        import jax  # `keras.ops` on JAX: one compiled call too

        try:
            return np.asarray(jax.jit(jax.vmap(rule.should_update))(steps), bool)
        except Exception:  # noqa: BLE001 (Python on the step: called one by one)
            pass
    return np.array([bool(np.asarray(rule.should_update(s))) for s in steps])


def join_keeps(masks, keeps, convert):
    """`masks` with the keep masks `{position: bool array}` joined: dropped = frozen.

    Args:
      masks: a `StatelessMasks`.
      keeps: `{position: bool array}`, positions in the masks' variables.
      convert: makes each table and boundaries array (from NumPy) what the
        step takes, e.g. `np.asarray` or `keras.ops.convert_to_tensor`.

    Example:

    >>> import numpy as np
    >>> masks = stateless.StatelessMasks((), (), (), (), 1)
    >>> join_keeps(masks, {0: np.array([True, False])}, np.asarray).positions
    (0,)
    """
    if not keeps:
        return masks
    found = {
        p: (np.asarray(t), b, s)
        for p, t, b, s in zip(
            masks.positions, masks.tables, masks.boundaries, masks.scales
        )
    }
    for i, keep in keeps.items():
        if i in found:
            table, boundaries, scale = found[i]
            if table.dtype == bool:
                table = table & keep
            else:
                table = table * keep.astype(table.dtype)
            found[i] = (table, boundaries, scale)
        else:
            found[i] = (keep[None], np.zeros((0,), np.int32), "step")
    positions = tuple(sorted(found))
    return stateless.StatelessMasks(
        positions,
        tuple(convert(found[p][0]) for p in positions),
        tuple(convert(np.asarray(found[p][1])) for p in positions),
        tuple(found[p][2] for p in positions),
        masks.count,
        masks.gates,
    )
