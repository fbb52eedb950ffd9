"""The masking stage as a pure function over values: `StatelessMasks` and `stateless_apply`.

Backend-independent (`keras.ops` only; Keras's `stateless_apply`, which it
calls, exists on JAX and PyTorch): the JAX backend's training step and
`maskfit.apply_gradients` run it, and it is the function users `jax.jit` in
a stateless loop. The masks are values too (`StatelessMasks`, read once on
the host from the declarations), so a new mask is a new argument, not a
retrace. One step, in the order Keras's `BaseOptimizer.apply` runs its own:

1. each mask in force at the optimizer step is selected from its schedule;
2. the gradients are masked (`where`: NaN and Inf gradients of frozen entries too);
3. `optimizer.stateless_apply`, with multipliers (`maskfit.optim.stateless_rates`);
4. around it, every assignment to a masked variable, and to each of its
   optimizer slots of its shape (momentum, Adam's moments, accumulated
   gradients), keeps the frozen entries as they are: `where(frozen,
   current, new)`, bit for bit, fused by XLA into the update that made the
   value (the state is still updated in place); its EMA average takes the
   variable's value there, so that `finalize_variable_values` cannot move
   it either. Slots of an optimizer whose update cannot read held values
   (`_elementwise`: Adafactor, custom classes) get their frozen entries
   back after the update instead.

Slots of another shape (Adafactor's factored second moments) are shared by
frozen and learning entries and evolve; the weights they feed stay exact.
"""

import collections

import keras
import numpy as np

from maskfit import internals, support
from maskfit.optim import rate_modes, stateless_rates
from maskfit.spec import declare
from maskfit.step import declared as declared_lib

__all__ = [
    "StatelessMasks",
    "mask_gradients",
    "masks_for",
    "optimizer_step",
    "select",
    "select_gates",
    "stateless_apply",
    "stateless_masks",
]


class StatelessMasks(
    collections.namedtuple(
        "StatelessMasks",
        ["positions", "tables", "boundaries", "scales", "count", "gates"],
        defaults=((),),
    )
):
    """The declared masks of a list of variables, as arrays.

    `tables` and `boundaries` are the values (a JAX pytree's leaves); the
    rest is structure, fixed while the masks' shapes and kinds are.

    Attributes:
      positions: the masked variables' positions in the variable list.
      tables: per masked variable, its mask in each interval of its schedule
        (`(intervals, *shape)`, a shape that broadcasts to the variable's;
        bool for masks of 0s and 1s).
      boundaries: per masked variable, the optimizer steps at which its next
        interval starts (int32, empty for a fixed mask).
      scales: per masked variable, what values other than 0 and 1 scale:
        `"step"` (the learning rate) or `"gradient"`.
      count: how many variables the list has.
      gates: per `OutputMask(..., backprop=True)`, `(layer, table, boundaries)`:
        its gate's `(intervals, units)` values (the layer is structure).

    Example:

    >>> import numpy as np
    >>> masks = StatelessMasks((1,), (np.ones((1, 3), bool),),
    ...                        (np.zeros((0,), np.int32),), ("step",), 2)
    >>> masks.structure
    ((1,), ('step',), 2, ((1, 3),), ('bool',), ())
    """

    @property
    def structure(self):
        """What a compiled step depends on; values of this structure need no retrace."""
        shapes = tuple(tuple(t.shape) for t in self.tables)
        dtypes = tuple(keras.backend.standardize_dtype(t.dtype) for t in self.tables)
        gates = tuple((id(layer), tuple(t.shape)) for layer, t, _ in self.gates)
        return (self.positions, self.scales, self.count, shapes, dtypes, gates)


def _table(mask, i):
    """The `i`-th covered variable's masks, one per interval, as one array."""
    if mask.layouts is None:
        table = np.asarray(mask.table)
    else:
        table = np.stack([mask.layouts[i].expand_numpy(v) for v in mask.table])
    if table.dtype == np.bool_ or np.all((table == 0) | (table == 1)):
        return table if table.dtype == np.bool_ else table != 0  # 1 byte, exact
    return table.astype(np.float32)


def masks_for(layer_specs, variables, host=False):
    """Reads `[(layer, spec)]` into the `StatelessMasks` of `variables`.

    Args:
      layer_specs: `[(layer, spec)]`, e.g. `maskfit.spec.declare.masked_layers(model)`.
      variables: the variables the masks are for, in the order the values
        will be passed (the optimizer's, for `stateless_apply`).
      host: leave the arrays in NumPy, for the caller to place (the JAX
        backend lays each out like its variable); tensors by default.

    Raises:
      ValueError: as `maskfit.step.declared.resolve_declared`.
    """
    declared = declared_lib.resolve_declared(layer_specs, variables)
    convert = np.asarray if host else keras.ops.convert_to_tensor
    found, gates = {}, []
    for mask in declared.values():
        boundaries = convert(np.asarray(mask.boundaries, np.int32).reshape(-1))
        if mask.backprop:  # a gate's mask: one per output unit, replicated
            table = keras.ops.convert_to_tensor(mask.table)
            gates.append((mask.layer, table, keras.ops.convert_to_tensor(boundaries)))
        for i, index in enumerate(mask.indices):
            table = convert(_table(mask, i))
            found[index] = (table, boundaries, mask.scale)
    positions = tuple(sorted(found))
    return StatelessMasks(
        positions,
        tuple(found[p][0] for p in positions),
        tuple(found[p][1] for p in positions),
        tuple(found[p][2] for p in positions),
        len(variables),
        tuple(gates),
    )


def stateless_masks(model, variables=None):
    """The masks declared on `model`'s layers, as values for `stateless_apply`.

    Read once, on the host; call it again after `maskfit.set_mask`. On JAX
    the result is a pytree: pass it to a `jax.jit` function as an argument,
    and new masks of the same structure need no retrace. Under a
    `keras.distribution` each mask is laid out like its variable.

    Args:
      model: a Keras model (or layer) with masks declared in it.
      variables: the variables the values will be for, in order:
        `model.trainable_variables` by default (what Keras builds the
        optimizer for).

    Raises:
      ValueError: as `maskfit.set_mask`'s checks when a spec does not fit.

    Example:

    >>> import keras, maskfit
    >>> dense = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> model = keras.Sequential([keras.Input((3,)), dense])
    >>> masks = maskfit.stateless_masks(model)
    >>> masks.positions, masks.count
    ((0, 1), 2)
    """
    variables = list(model.trainable_variables if variables is None else variables)
    place = getattr(support.step_backend(), "place_masks", lambda m, _: m)  # JAX's
    return place(masks_for(declare.masked_layers(model), variables), variables)


def _in_force(table, boundaries, step):
    if boundaries.shape[0] == 0:
        return table[0]
    at = keras.ops.reshape(keras.ops.cast(step, "int32"), (1,))
    interval = keras.ops.searchsorted(boundaries, at, side="right")[0]
    return keras.ops.take(table, interval, axis=0)


def select(masks, step):
    """The mask in force at optimizer `step` (a scalar tensor), per masked variable."""
    return [_in_force(t, b, step) for t, b in zip(masks.tables, masks.boundaries)]


def select_gates(masks, step):
    """`[(layer, values)]`: each backprop gate's `(units,)` values in force at `step`."""
    return [(layer, _in_force(t, b, step)) for layer, t, b in masks.gates]


def optimizer_step(optimizer, optimizer_values):
    """`optimizer.iterations` as it is in `optimizer_values` (a scalar tensor)."""
    with keras.StatelessScope(list(zip(optimizer.variables, optimizer_values))):
        return keras.ops.convert_to_tensor(optimizer.iterations)


def _keeps(mask):
    """Where `mask` (bool, or a number per entry) lets an entry learn."""
    if keras.backend.standardize_dtype(mask.dtype) == "bool":
        return mask
    return keras.ops.not_equal(mask, 0)


def mask_gradients(masks, selected, gradients):
    """`gradients` with each selected mask applied: 0 where frozen, NaN and Inf too.

    Values other than 0 and 1 of a `scale="gradient"` mask scale the
    gradient; those of a `scale="step"` mask are left to the update.
    """
    gradients = list(gradients)
    for position, mask, scale in zip(masks.positions, selected, masks.scales):
        gradient = gradients[position]
        if gradient is None:
            continue
        keep = _keeps(mask)
        if scale == "gradient" and keep is not mask:
            gradient = gradient * keras.ops.cast(mask, gradient.dtype)
        gradients[position] = keras.ops.where(
            keep, gradient, keras.ops.zeros((), gradient.dtype)
        )
    return gradients


def _slots(optimizer, variables):
    """Per variable: `(slots, average)`, the optimizer variables that hold per entry.

    `slots` are its per-entry slots (of its shape: momentum, Adam's moments,
    accumulated gradients), each as `(slot, inline)`: whether it may be held
    at each assignment (`_elementwise`); `average` its EMA average, or None.
    Read on the host from the optimizers within `optimizer`; cached on it.
    """
    key = (tuple(id(v) for v in variables), tuple(id(v) for v in optimizer.variables))
    cache = getattr(optimizer, "_maskfit_stateless_slots", None)
    if cache is not None and cache[0] == key:
        return cache[1]
    slots, averages = collections.defaultdict(list), {}
    for each in internals.optimizers_within(optimizer):
        if not each.built:
            continue
        ema = {id(a) for a in internals.ema_averages_by_variable(each).values()}
        found, _ = internals.optimizer_state(each)
        inline = _elementwise(each)
        for (_, variable_id), slot in found.items():
            if id(slot) in ema:
                averages[variable_id] = slot
            else:
                slots[variable_id].append((slot, inline))
    found = [
        (
            [s for s in slots.get(id(v), ()) if tuple(s[0].shape) == tuple(v.shape)],
            averages.get(id(v)),
        )
        for v in variables
    ]
    internals.set_untracked(optimizer, "_maskfit_stateless_slots", (key, found))
    return found


def _elementwise(optimizer):
    """Whether `optimizer`'s update may read held slot values within a step.

    True for the Keras optimizers whose update reads a slot it just wrote
    only where a held (older) value stays finite: all but Adafactor, which
    divides by its new second moment (0 where held from the start, so NaN)
    and spreads that through an RMS over the variable. Others (and custom
    classes) get their slots' frozen entries back after the update instead.
    """
    rates = rate_modes.keras_rates(optimizer)
    return rates is not None and not isinstance(optimizer, keras.optimizers.Adafactor)


class _Held:
    """While active, every assignment to a held variable keeps its frozen entries.

    Each `assign` (and `assign_add`, `assign_sub`) of a variable, or of one
    of its slots, inside the optimizer's update writes `where(frozen,
    current, new)`: frozen entries keep the value they have, so they hold
    through every stage of the update (weight decay, the step, EMA
    overwrite, gradient accumulation); an EMA average takes the variable's
    value there. Each `where` sits next to the update that made its value,
    so XLA fuses it there, and the state is still updated in place.
    """

    def __init__(self, holds):
        self._holds = holds  # [(variable, frozen, source or None)]
        self._undo = []

    def __enter__(self):
        for variable, frozen, source in self._holds:

            def assign(
                value,
                variable=variable,
                frozen=frozen,
                source=source,
                original=variable.assign,
            ):
                current = (variable if source is None else source).value
                value = keras.ops.convert_to_tensor(value, variable.dtype)
                current = keras.ops.cast(current, value.dtype)
                return original(keras.ops.where(frozen, current, value))

            self._undo.append(internals.set_method(variable, "assign", assign))
        return self

    def __exit__(self, *exc_info):
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        return False


def stateless_apply(
    optimizer, masks, optimizer_values, gradients, trainable_values, mask=None
):
    """`optimizer.stateless_apply`, with masked entries (and their slots) held exactly.

    A pure function of its values: `jax.jit` it over the values and masks
    (the optimizer and the masks' structure are fixed when it is traced).
    It runs where Keras's optimizers have `stateless_apply` (JAX, PyTorch);
    on TensorFlow Keras refuses it: use `maskfit.apply_gradients` there.

    Args:
      optimizer: a built Keras optimizer.
      masks: the `StatelessMasks` of the optimizer's variables
        (`maskfit.stateless_masks`).
      optimizer_values: one value per `optimizer.variables`.
      gradients: one gradient (or None: no update at all) per variable the
        optimizer was built for.
      trainable_values: one value per variable the optimizer was built for.
      mask: a function `(gradients, selected) -> gradients` that masks the
        gradients instead of the default (`MaskedModel.apply_grad_masks`);
        frozen entries are held whatever it returns.

    Returns:
      `(new trainable values, new optimizer values)`, as lists.

    Example:

    >>> import keras, maskfit
    >>> dense = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> model = keras.Sequential([keras.Input((3,)), dense])
    >>> optimizer = keras.optimizers.AdamW(0.1)
    >>> optimizer.build(model.trainable_variables)
    >>> masks = maskfit.stateless_masks(model)
    >>> values = [keras.ops.convert_to_tensor(v) for v in model.trainable_variables]
    >>> grads = [keras.ops.ones(v.shape) for v in model.trainable_variables]
    >>> state = [keras.ops.convert_to_tensor(v) for v in optimizer.variables]
    >>> def held(values, new):  # kernel column 1 frozen, column 0 learns
    ...     old, now = (keras.ops.convert_to_numpy(v[0]) for v in (values, new))
    ...     return bool((now[:, 1] == old[:, 1]).all() and (now[:, 0] != old[:, 0]).all())
    >>> if keras.backend.backend() == "tensorflow":  # Keras has no stateless_apply there
    ...     print(True)
    ... else:
    ...     new, _ = maskfit.stateless_apply(optimizer, masks, state, grads, values)
    ...     print(held(values, new))
    True
    """
    optimizer_values = list(optimizer_values)
    trainable_values = list(trainable_values)
    gradients = list(gradients)
    selected = select(masks, optimizer_step(optimizer, optimizer_values))
    if mask is None:
        gradients = mask_gradients(masks, selected, gradients)
    else:
        gradients = list(mask(gradients, selected))
    variables = internals.optimizer_built_variables(optimizer)
    multipliers = {
        position: m
        for position, m, scale in zip(masks.positions, selected, masks.scales)
        if scale == "step" and keras.backend.standardize_dtype(m.dtype) != "bool"
    }
    held = dict(
        zip(masks.positions, (keras.ops.logical_not(_keeps(m)) for m in selected))
    )
    for position, gradient in enumerate(gradients):
        if gradient is None:
            held[position] = keras.ops.convert_to_tensor(True)  # no update at all
    holds, slot_holds = [], []
    slots = _slots(optimizer, variables) if held else ()
    where = {id(v): i for i, v in enumerate(optimizer.variables)}
    for position, frozen in held.items():
        variable = variables[position]
        own, average = slots[position]
        holds.append((variable, frozen, None))
        if average is not None:
            holds.append((average, frozen, variable))
        for slot, inline in own:
            if inline:
                holds.append((slot, frozen, None))
            elif id(slot) in where:
                slot_holds.append((where[id(slot)], frozen))
    scaled = {id(variables[p]): m for p, m in multipliers.items()}
    with stateless_rates.scaled(optimizer, scaled), _Held(holds):
        new_trainable, new_optimizer = optimizer.stateless_apply(
            optimizer_values, gradients, trainable_values
        )
    # Slots whose update cannot read held values (`_elementwise`): put back.
    new_optimizer = list(new_optimizer)
    for index, frozen in slot_holds:
        new_optimizer[index] = keras.ops.where(
            frozen, optimizer_values[index], new_optimizer[index]
        )
    return list(new_trainable), list(new_optimizer)
