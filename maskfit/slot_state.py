"""The state behind declared masks in the step: one `SlotState` per mask slot.

A mask slot (`plan.MaskSlot`) is kept in non-trainable `tf.Variable`s made
once, outside the compiled step: the mask in force and, for a schedule, its
table of masks and their boundaries; `where_masked` and `is_frozen` read a
mask the same way everywhere. `VariableMasks` says what masks one
variable (its slot's state, its unit layout, a rule's keep mask) and combines
them in the step; `variable_needs` reads, on the host, what a compiled step
must do for the variable (`step_plan.VariableNeeds`). `masker.GradientMasker`
builds and applies them.
"""

import collections

import numpy as np
import tensorflow as tf

from maskfit import step_plan

__all__ = [
    "SlotState",
    "VariableMasks",
    "is_frozen",
    "state_dtype",
    "variable_needs",
    "where_masked",
]


def where_masked(values, mask):
    """`values` where `mask` (bool, or a number per entry) is not 0, +0.0 where it is.

    One kernel, not three (compare, multiply, select): `multiply_no_nan`
    gives +0 wherever the mask is 0, even for a NaN or Inf value, and
    `values * mask` elsewhere (the values themselves, bit for bit, where a
    bool mask is True). In graph mode this halves the masking cost per entry
    of a select, and a bool mask cast to 0/1 costs about half a select; XLA
    fuses either form.
    """
    values = tf.convert_to_tensor(values)
    return tf.math.multiply_no_nan(values, tf.cast(mask, values.dtype))


def is_frozen(mask):
    """Where `mask` (bool, or a number per entry) freezes an entry."""
    if mask.dtype == tf.bool:
        return tf.logical_not(mask)
    return tf.equal(mask, tf.zeros([], mask.dtype))


def state_dtype(slot, variable_dtype):
    """bool for an `ElementMask` of 0s and 1s (a quarter of float32's bytes to
    keep and to read each step), else the variable's dtype."""
    if slot.kind == "element" and np.all((slot.table == 0) | (slot.table == 1)):
        return tf.bool
    return variable_dtype


def _as_state(values, dtype):
    if dtype == tf.bool:
        return tf.constant(np.asarray(values) != 0)
    return tf.constant(values, dtype)


class SlotState:
    """The variables behind one `MaskSlot`: the mask in force, and its schedule.

    `current` holds the mask in force: the `(units,)` values of an
    `OutputMask` slot, or the variable-shaped mask of an `ElementMask` slot.
    `table` and `boundaries` (None for a fixed mask) hold a schedule's masks,
    one row per interval. Nothing else is state: an `OutputMask`'s mask on a
    variable is `layout.expand(current)`, computed in the step from a
    constant index. A variable is fully frozen only when all of its layout's
    units are 0 *and* the layout has no shared entries (`layout.has_shared`).
    """

    def __init__(self, slot, dtype):
        name = f"grad_mask_{slot.layer.name}_{slot.kind}"
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.structure = (slot.structure, dtype)
        self.dtype = dtype
        self.current = tf.Variable(
            _as_state(slot.table[0], dtype),
            trainable=False,
            name=name,
            aggregation=aggregation,
        )
        self.table = self.boundaries = None
        if len(slot.table) > 1:
            self.table = tf.Variable(
                _as_state(slot.table, dtype),
                trainable=False,
                name=name + "_table",
                aggregation=aggregation,
            )
            self.boundaries = tf.Variable(
                tf.constant(slot.boundaries, tf.int64),
                trainable=False,
                name=name + "_boundaries",
                aggregation=aggregation,
            )

    def assign(self, slot, step):
        self.current.assign(_as_state(slot.values_at(step), self.dtype))
        if self.table is not None:
            self.table.assign(_as_state(slot.table, self.dtype))
            self.boundaries.assign(tf.constant(slot.boundaries, tf.int64))

    def select(self, step):
        """In the step: makes `current` the mask of the interval `step` is in."""
        step = tf.reshape(tf.cast(step, tf.int64), [1])
        interval = tf.searchsorted(self.boundaries, step, side="right")[0]
        self.current.assign(tf.gather(self.table, interval))


class VariableMasks(
    collections.namedtuple("VariableMasks", ["state", "layout", "keep"])
):
    """What masks one variable: its declared mask and a rule's keep mask.

    Attributes:
      state: the `SlotState` of its declared mask, or None (a rule only, or
        a mask that is never read because it freezes the variable whole).
      layout: the `UnitLayout` of an `OutputMask` slot, else None.
      keep: a rule's keep mask (a bool `tf.Variable` of the variable's shape),
        or None.
    """

    def declared(self, current):
        """The declared mask from the slot's `current` value (broadcastable)."""
        current = tf.convert_to_tensor(current)
        return current if self.layout is None else self.layout.expand(current)

    def frozen_where(self, current):
        """Where the declared mask (from the slot's `current` value) freezes an entry."""
        return is_frozen(self.declared(current))

    def combined(self, current, keep):
        """The mask in force: the declared one where kept, 0 where dropped."""
        mask = None if current is None else self.declared(current)
        if keep is None:
            return mask
        keep = tf.convert_to_tensor(keep)
        if mask is None:
            return keep
        if mask.dtype == tf.bool:
            return tf.logical_and(mask, keep)
        return tf.where(keep, mask, tf.zeros([], mask.dtype))


def variable_needs(slot, i):
    """The `VariableNeeds` of the `i`-th variable a slot covers."""
    if slot.layouts is None:
        return step_plan.VariableNeeds.from_masks(slot.boundaries, slot.table)
    layout = slot.layouts[i]
    return step_plan.VariableNeeds.from_masks(
        slot.boundaries,
        [layout.expand_numpy(values) for values in slot.table],
        has_shared=layout.has_shared,
    )
