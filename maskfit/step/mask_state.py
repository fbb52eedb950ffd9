"""The state behind declared masks in the step: one `MaskState` per declared mask.

A `DeclaredMask` is kept in non-trainable `tf.Variable`s made once, outside
the compiled step: the mask in force and, for a schedule, its table of masks
and their boundaries; `where_masked` and `is_frozen` read a mask the same way
everywhere. `VariableMasks` says what masks one variable (its declared mask's
state, its unit layout, a rule's keep mask) and combines them in the step;
`MaskStates` keeps them for all of a step's masks, in step with the
declarations. `maskfit.step.masker.GradientMasker` uses them; the masks of one
step are read from them once (`maskfit.step.pipeline.make_view`).
"""

import collections

import numpy as np
import tensorflow as tf

from maskfit.spec import gate
from maskfit.step import plan as plan_lib

__all__ = [
    "MaskState",
    "MaskStates",
    "VariableMasks",
    "is_frozen",
    "mask_gradient",
    "state_dtype",
    "where_masked",
]


def where_masked(values, mask):
    """`values` where `mask` (bool, or a number per entry) is not 0, +0.0 where it is.

    One kernel, not three (compare, multiply, select): `multiply_no_nan`
    gives +0 wherever the mask is 0, even for a NaN or Inf value, and
    `values * mask` elsewhere (the values themselves, bit for bit, where a
    bool mask is True; subnormal values become 0, as in every TensorFlow CPU
    kernel, Keras's optimizers included). In graph mode this halves the masking cost per entry
    of a select, and a bool mask cast to 0/1 costs about half a select; XLA
    fuses either form. In a graph the cast waits for `values`: it does not
    depend on them, so TensorFlow's executor would run every mask's cast at
    the start of the step and hold a float copy of each mask until its
    gradient comes (a float32 per masked entry; issue 43).
    """
    values = tf.convert_to_tensor(values)
    with tf.control_dependencies([values] if tf.inside_function() else []):
        mask = tf.cast(mask, values.dtype)
    return tf.math.multiply_no_nan(values, mask)


def mask_gradient(gradient, mask):
    """`gradient` (dense or `IndexedSlices`) with `mask` applied (`where_masked`).

    `mask` has the variable's rank; for `IndexedSlices` a size-1 first axis
    broadcasts against the gathered rows, any other is gathered with them.
    """
    if isinstance(gradient, tf.IndexedSlices):
        rows = mask if mask.shape[0] == 1 else tf.gather(mask, gradient.indices)
        values = where_masked(gradient.values, rows)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return where_masked(gradient, mask)


def is_frozen(mask):
    """Where `mask` (bool, or a number per entry) freezes an entry."""
    if mask.dtype == tf.bool:
        return tf.logical_not(mask)
    return tf.equal(mask, tf.zeros([], mask.dtype))


def state_dtype(declared, variable_dtype):
    """bool for an `ElementMask` of 0s and 1s (a quarter of float32's bytes to
    keep and to read each step), else the variable's dtype."""
    if declared.kind == "element" and declared.table.dtype == np.bool_:
        return tf.bool
    if declared.kind == "element" and np.all(
        (declared.table == 0) | (declared.table == 1)
    ):
        return tf.bool
    return variable_dtype


def _as_state(values, dtype):
    if dtype == tf.bool:
        values = np.asarray(values)
        return tf.constant(values if values.dtype == np.bool_ else values != 0)
    return tf.constant(values, dtype)


class MaskState:
    """The variables behind one `DeclaredMask`: the mask in force, and its schedule.

    `current` holds the mask in force: the `(units,)` values of an
    `OutputMask`, or the variable-shaped mask of an `ElementMask`.
    `table` and `boundaries` (None for a fixed mask) hold a schedule's masks,
    one row per interval. Nothing else is state: an `OutputMask`'s mask on a
    variable is `layout.expand(current)`, computed in the step from a
    constant index. A variable is fully frozen only when all of its layout's
    units are 0 *and* the layout has no shared entries (`layout.has_shared`).
    """

    def __init__(self, declared, dtype):
        name = f"grad_mask_{declared.layer.name}_{declared.kind}"
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.structure = (declared.structure, dtype)
        self.dtype = dtype
        self.current = tf.Variable(
            _as_state(declared.table[0], dtype),
            trainable=False,
            name=name,
            aggregation=aggregation,
        )
        self.table = self.boundaries = None
        if len(declared.table) > 1:
            self.table = tf.Variable(
                _as_state(declared.table, dtype),
                trainable=False,
                name=name + "_table",
                aggregation=aggregation,
            )
            self.boundaries = tf.Variable(
                tf.constant(declared.boundaries, tf.int64),
                trainable=False,
                name=name + "_boundaries",
                aggregation=aggregation,
            )

    def assign(self, declared, step):
        """Assigns `declared`'s values (of this state's structure) at optimizer `step`."""
        self.current.assign(_as_state(declared.values_at(step), self.dtype))
        if self.table is not None:
            self.table.assign(_as_state(declared.table, self.dtype))
            self.boundaries.assign(tf.constant(declared.boundaries, tf.int64))

    def select(self, step):
        """In the step: makes `current` the mask of the interval `step` is in."""
        step = tf.reshape(tf.cast(step, tf.int64), [1])
        interval = tf.searchsorted(self.boundaries, step, side="right")[0]
        self.current.assign(tf.gather(self.table, interval))


class VariableMasks(
    collections.namedtuple("VariableMasks", ["state", "layout", "keep", "scale"])
):
    """What masks one variable: its declared mask and a rule's keep mask.

    Attributes:
      state: the `MaskState` of its declared mask, or None (a rule only, or
        a mask that is never read because it freezes the variable whole).
      layout: the `UnitLayout` of an `OutputMask`, else None.
      keep: a rule's keep mask (a bool `tf.Variable` of the variable's shape),
        or None.
      scale: what the declared mask's values other than 0 and 1 scale,
        `"step"` (the learning rate; `multiplier`) or `"gradient"`.
    """

    def expand(self, current):
        """The declared mask on the variable, from its state's `current` value
        (a shape that broadcasts to the variable's)."""
        current = tf.convert_to_tensor(current)
        return current if self.layout is None else self.layout.expand(current)

    def gradient_mask(self, declared):
        """What the gradient is masked with: 0 where dropped or frozen, else the
        declared value (`scale="gradient"`) or 1 (`scale="step"`).

        Args:
          declared: the declared mask in force, expanded (`expand`), or None.
        """
        mask = declared
        if mask is not None and self.scale == "step" and mask.dtype != tf.bool:
            mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
        if self.keep is None:
            return mask
        keep = tf.convert_to_tensor(self.keep)
        if mask is None:
            return keep
        if mask.dtype == tf.bool:
            return tf.logical_and(mask, keep)
        return tf.where(keep, mask, tf.zeros([], mask.dtype))


class MaskStates:
    """The state of every declared mask of a step, and what masks each variable.

    Attributes:
      states: `{key: MaskState or None}` per `DeclaredMask` key; None for a
        mask that is never read in the step (it freezes its variables whole,
        and they are left out of it).
      by_index: `{position: VariableMasks}` for every masked variable (a
        declared mask, a rule's keep mask, or both).
      needs: `{position: VariableNeeds}` for the same variables.
    """

    def __init__(self):
        self.states = {}
        self.by_index = {}
        self.needs = {}
        self._declared = {}

    def sync(self, declared, ruled, keeps, variables, step, skip_frozen):
        """Makes the state match `declared` at optimizer `step`; True to retrace.

        Values of masks whose structure is unchanged are assigned in place. A
        mask whose spec was removed becomes all ones, so removal needs no
        retrace either.

        Args:
          declared: `{key: DeclaredMask}` from `resolve_declared`.
          ruled: positions of the variables a rule covers.
          keeps: `{position: keep mask variable}` of the rules.
          variables: the step's variables, in its order.
          step: the optimizer step the masks start at.
          skip_frozen: whether fully frozen variables are left out of the step.
        """
        declared = dict(declared)
        for key, mask in self._declared.items():
            if key not in declared:
                declared[key] = mask._replace(table=np.ones_like(mask.table))
        needs = {
            index: plan_lib.needs_of(mask, i)
            for mask in declared.values()
            for i, index in enumerate(mask.indices)
        }
        for index in ruled:
            needs[index] = plan_lib.VariableNeeds.ruled(needs.get(index))
        # (If every variable is masked and always frozen, one stays in the
        # step, so the optimizer's steps count on: all keep their state then.)
        # Without skip_frozen (apply_gradients) every mask is read in the step.
        skippable = skip_frozen and (
            len(needs) < len(variables)
            or not all(all(n.frozen) for n in needs.values())
        )
        retrace = False
        states = {}
        for key, mask in declared.items():
            if (
                skippable
                and mask.kind == "element"
                and all(all(needs[i].frozen) for i in mask.indices)
            ):
                # Never in the step: its mask is never read there.
                states[key] = None
                retrace = retrace or self.states.get(key) is not None
                continue
            dtype = state_dtype(mask, variables[mask.indices[0]].dtype)
            state = self.states.get(key)
            if state is None or state.structure != (mask.structure, dtype):
                state = MaskState(mask, dtype)
                if mask.backprop:
                    gate.set_values(mask.layer, state.current)
                retrace = True
            state.assign(mask, step)
            states[key] = state
        self.states, self._declared, self.needs = states, declared, needs
        self.by_index = {
            index: VariableMasks(
                states[key],
                None if mask.layouts is None else mask.layouts[i],
                keeps.get(index),
                mask.scale,
            )
            for key, mask in declared.items()
            for i, index in enumerate(mask.indices)
        }
        for index in ruled:
            if index not in self.by_index:
                self.by_index[index] = VariableMasks(None, None, keeps[index], "step")
        return retrace

    @property
    def scheduled(self):
        """Whether a mask follows a schedule (the step selects it each step)."""
        return any(s is not None and s.table is not None for s in self.states.values())

    def select(self, step):
        """In the step: makes every scheduled mask the one in force at `step`."""
        for state in self.states.values():
            if state is not None and state.table is not None:
                state.select(step)

    def state_bytes(self):
        """Bytes of mask state kept (masks, schedules, boundaries, unit layouts)."""
        total = 0
        for state in filter(None, self.states.values()):
            for variable in (state.current, state.table, state.boundaries):
                if variable is not None:
                    total += variable.shape.num_elements() * variable.dtype.size
        for mask in self._declared.values():
            total += sum(layout.index.nbytes for layout in mask.layouts or ())
        return total
