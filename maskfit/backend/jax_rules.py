"""Magnitude pruning in the JAX step: keep masks computed on the host at pruning steps.

Before the compiled step of optimizer step `s`, where a rule updates
(`rule.should_update(s)`, TF-MOT's schedule evaluated eagerly), the keep
masks of its variables are computed from the state's weights by the rule's
own `keep_masks`, the very function the TensorFlow step runs (same ranking,
ties and sparsity; entries a declared mask freezes are protected, as
there), the dropped weights set to +0.0 in the state, and the keep masks
joined to the step's `StatelessMasks`: a dropped entry is frozen, so it and
its optimizer slots are held bit for bit by every later step. The keep
masks live in the model's lifecycle (`pending_keeps`, by variable key),
where saving reads them and loading puts them. After the rules' last update
step nothing runs on the host but the step itself.
"""

import jax
import numpy as np
import tensorflow as tf

from maskfit import paths
from maskfit.backend import sharding
from maskfit.model import training
from maskfit.spec import rules
from maskfit.step import stateless

__all__ = ["HostRules", "with_keeps"]


class HostRules:
    """The mask rules of one model's JAX step, run on the host at their update steps.

    Args:
      model: a `MaskedModel` whose rules the JAX backend runs (magnitude pruning).

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = pruning.prune_low_magnitude(
    ...     keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    >>> len(HostRules(model).groups)
    1
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
        if self.last is None or step <= self.last:
            state = self._update(state, masks, step)
        # `pending_keeps` is a new dict whenever a keep mask changes.
        pending = self.model._maskfit_lifecycle().pending_keeps
        key = (id(masks), id(pending))
        if self._joined[0] != key:
            joined = with_keeps(masks, self.keeps(), values=state[0])
            self._joined = (key, joined, masks, pending)
        return state, self._joined[1]

    def _due(self, step):
        """The groups whose rule updates at `step`: read from a table of `_CHUNK`
        steps, each computed once by one compiled call of the rules'
        `should_update` (microseconds a step instead of an eager call's
        hundreds)."""
        start = step - step % _CHUNK
        if self._chunk[0] != start:
            steps = tf.range(start, start + _CHUNK, dtype=tf.int64)
            self._chunk = (start, [_updates(g.rule, steps) for g in self.groups])
        return [g for g, due in zip(self.groups, self._chunk[1]) if due[step - start]]

    def _update(self, state, masks, step):
        due = self._due(step)
        if not due:
            return state
        at = tf.constant(step, tf.int64)
        trainable = list(state[0])
        keeps = self.keeps()
        selected = dict(zip(masks.positions, stateless.select(masks, step)))
        new = {}
        for group in due:
            weights, protected, current = [], [], []
            for i in group.indices:
                value = np.asarray(trainable[i])
                keep = keeps.get(i, np.ones(value.shape, bool))
                guard = None
                if i in selected:
                    frozen = np.broadcast_to(np.asarray(selected[i]) == 0, value.shape)
                    guard = tf.constant(frozen & keep)
                weights.append(tf.constant(value))
                protected.append(guard)
                current.append(tf.constant(keep))
            kept = group.rule.keep_masks(
                at,
                [self.variables[i] for i in group.indices],
                weights,
                protected,
                current,
            )
            for i, mask in zip(group.indices, kept):
                new[i] = np.asarray(tf.convert_to_tensor(mask).numpy()) != 0
        lifecycle = self.model._maskfit_lifecycle()
        lifecycle.pending_keeps = {
            **lifecycle.pending_keeps,
            **{self.keys[i]: keep for i, keep in new.items()},
        }
        for i, keep in new.items():
            zero = jax.numpy.zeros((), trainable[i].dtype)
            value = jax.numpy.where(keep, trainable[i], zero)
            trainable[i] = jax.device_put(value, trainable[i].sharding)
        return (trainable,) + tuple(state[1:])


_CHUNK = 1024


def _updates(rule, steps):
    """`rule.should_update` at each of `steps` (int64), as a numpy bool array."""

    @tf.function
    def every(steps):
        return tf.map_fn(
            lambda step: tf.cast(rule.should_update(step), tf.bool),
            steps,
            fn_output_signature=tf.bool,
        )

    return every(steps).numpy()


def with_keeps(masks, keeps, values=None):
    """`masks` with the keep masks `{position: bool array}` joined: dropped = frozen.

    With the variables' `values` (the step's state), each table goes from
    the host straight to the devices, laid out like its variable
    (`maskfit.backend.sharding.place`).

    Example:

    >>> import numpy as np
    >>> masks = stateless.StatelessMasks((), (), (), (), 1)
    >>> with_keeps(masks, {0: np.array([True, False])}).positions
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
    convert = jax.numpy.asarray if values is None else np.asarray
    joined = stateless.StatelessMasks(
        positions,
        tuple(convert(found[p][0]) for p in positions),
        tuple(convert(found[p][1]) for p in positions),
        tuple(found[p][2] for p in positions),
        masks.count,
    )
    return joined if values is None else sharding.place(joined, values)
