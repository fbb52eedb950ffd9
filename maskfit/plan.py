"""Resolving the specs on layers into mask slots: which variables, which values, when."""

import collections

import numpy as np

from maskfit import specs

__all__ = ["MaskEntry", "MaskSlot", "plan_masks", "resolve_masks"]


class MaskSlot(
    collections.namedtuple(
        "MaskSlot",
        ["layer", "kind", "indices", "table", "boundaries", "backprop", "layouts"],
    )
):
    """One mask, shared by the variables it covers.

    An `OutputMask` makes one slot of shape `(units,)` for all the variables of
    its layer that have entries owned by single units; each covered variable
    has a `units.UnitLayout` that expands the `(units,)` values onto it, in
    the step. An `ElementMask` makes one slot per named variable, of that
    variable's shape. Variables whose every entry is shared get no slot.

    Attributes:
      layer: the layer that carries the spec.
      kind: `"output"` or `"element"`.
      indices: positions of the covered variables in the step's variable list.
      table: float32 array `(intervals, *mask_shape)`, one mask per interval.
      boundaries: the steps at which the next interval starts (empty if fixed).
      backprop: whether the layer's output gradient is gated too.
      layouts: for `"output"`, one `UnitLayout` per index; else None.
    """

    @property
    def structure(self):
        """What the compiled step depends on; values may change, this may not."""
        layouts = (
            () if self.layouts is None else tuple(l.signature for l in self.layouts)
        )
        return (self.kind, self.table.shape, self.backprop, layouts)

    def values_at(self, step):
        """The mask in force at optimizer step `step`."""
        return self.table[int(np.searchsorted(self.boundaries, step, side="right"))]


def _output_slot(layer, spec, position):
    """The slot of an `OutputMask` (or a schedule of them); None if nothing is owned."""
    boundaries, interval_specs = spec.schedule()
    resolved = interval_specs[0].layer_units(layer)
    for interval_spec in interval_specs[1:]:
        interval_spec.layer_units(layer)  # checks its length (cached)
    covered = [
        (position[id(variable)], layout)
        for variable, layout in resolved.layouts
        if layout is not None and id(variable) in position
    ]
    if not covered:
        return None
    indices, layouts = zip(*covered)
    return MaskSlot(
        layer=layer,
        kind="output",
        indices=indices,
        table=np.stack([s.values for s in interval_specs]).astype(np.float32),
        boundaries=tuple(boundaries),
        backprop=spec.backprop,
        layouts=layouts,
    )


def _element_slots(layer, spec, position):
    """One slot per named variable; its masks keep the shape they were given.

    Each interval's mask broadcasts to the variable; the table holds them at
    the smallest shape they all broadcast from, so a mask given as a scalar or
    per column costs that much, and a single full-size mask is not copied.
    """
    boundaries, interval_specs = spec.schedule()
    grouped = collections.defaultdict(lambda: ([], []))
    for interval, interval_spec in enumerate(interval_specs):
        for variable, mask, _ in interval_spec.resolve(layer):
            index = position.get(id(variable))
            if index is None:
                continue
            key = (id(layer), "element", variable.path)
            indices, masks = grouped[key]
            if interval == 0:
                indices.append(index)
            if len(masks) == interval:
                rank = len(variable.shape)
                masks.append(np.asarray(mask, np.float32).reshape(
                    (1,) * (rank - np.ndim(mask)) + np.shape(mask)
                ))
    slots = {}
    for key, (indices, masks) in grouped.items():
        shape = tuple(max(sizes) for sizes in zip(*(m.shape for m in masks)))
        if len(masks) == 1 and masks[0].shape == shape:
            table = masks[0][None]  # a view of the spec's own array
        else:
            table = np.stack([np.broadcast_to(m, shape) for m in masks])
        slots[key] = MaskSlot(
            layer=layer,
            kind="element",
            indices=tuple(indices),
            table=table,
            boundaries=tuple(boundaries),
            backprop=spec.backprop,
            layouts=None,
        )
    return slots


def _is_output(spec):
    return isinstance(spec.schedule()[1][0], specs.OutputMask)


def plan_masks(layer_specs, variables):
    """Resolves `[(layer, spec)]` against the step's `variables` into slots.

    Args:
      layer_specs: `[(layer, spec)]`, e.g. from `declare.masked_layers(model)`.
      variables: the trainable variables the step updates, in its order.

    Returns:
      A dict from a slot key to its `MaskSlot`.

    Raises:
      ValueError: when a spec does not fit its layer, a layer with a mask has no
        trainable variables, or two specs cover the same variable.
    """
    position = {id(v): i for i, v in enumerate(variables)}
    owner = {}
    slots = {}
    for layer, spec in layer_specs:
        if not layer.trainable_weights:
            raise ValueError(
                f"Layer '{layer.name}' carries {spec!r} but has no trainable"
                " variables, so the mask would do nothing. Remove it with"
                " set_mask(layer, None), or set layer.trainable = True."
            )
        if _is_output(spec):
            slot = _output_slot(layer, spec, position)
            planned = {} if slot is None else {(id(layer), "output"): slot}
        else:
            planned = _element_slots(layer, spec, position)
        for key, slot in planned.items():
            for index in slot.indices:
                if index in owner:
                    raise ValueError(
                        f"Variable '{variables[index].path}' is covered by the mask"
                        f" of layer '{owner[index].name}' and by that of layer"
                        f" '{layer.name}'. Declare its mask on one layer only."
                    )
                owner[index] = layer
            slots[key] = slot
    return slots


class MaskEntry(
    collections.namedtuple("MaskEntry", ["layer", "kind", "mask", "shared"])
):
    """The mask on one variable at one step, for reports.

    Attributes:
      layer: the layer that carries the spec.
      kind: `"output"` or `"element"`.
      mask: float32 array that broadcasts to the variable (shared entries 1).
      shared: for `"output"`, a boolean array that broadcasts to the variable,
        True where the entry is shared by several units; else None.
    """


def resolve_masks(layer_specs, variables, step=0):
    """Maps positions in `variables` to their `MaskEntry` at optimizer `step`.

    Unlike `plan_masks`, the variables of an `OutputMask` layer whose every
    entry is shared are included (mask 1, all shared). Raises as `plan_masks`.
    """
    entries = {}
    for slot in plan_masks(layer_specs, variables).values():
        values = slot.values_at(step)
        for i, index in enumerate(slot.indices):
            if slot.kind == "output":
                layout = slot.layouts[i]
                entries[index] = MaskEntry(
                    slot.layer, "output", layout.expand_numpy(values), layout.shared
                )
            else:
                entries[index] = MaskEntry(slot.layer, "element", values, None)
    position = {id(v): i for i, v in enumerate(variables)}
    for layer, spec in layer_specs:
        if not _is_output(spec):
            continue
        for variable, layout in spec.schedule()[1][0].layer_units(layer).layouts:
            index = position.get(id(variable))
            if layout is None and index is not None:
                ones = np.ones((1,) * len(variable.shape), np.float32)
                entries[index] = MaskEntry(layer, "output", ones, ones > 0)
    return entries
