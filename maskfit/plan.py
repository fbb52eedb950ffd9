"""Resolving the specs on layers into mask slots: which variables, which values, when."""

import collections

import numpy as np

__all__ = ["MaskSlot", "plan_masks", "resolve_masks"]


class MaskSlot(
    collections.namedtuple(
        "MaskSlot", ["layer", "kind", "indices", "table", "boundaries", "backprop"]
    )
):
    """One mask, shared by the variables it covers.

    An `OutputMask` makes one slot of shape `(units,)` for all the variables of
    its layer that it covers (kernel, bias...); an `ElementMask` makes one slot
    per named variable, of that variable's shape.

    Attributes:
      layer: the layer that carries the spec.
      kind: `"output"` or `"element"`.
      indices: positions of the covered variables in the step's variable list.
      table: float32 array `(intervals, *mask_shape)`, one mask per interval.
      boundaries: the steps at which the next interval starts (empty if fixed).
      backprop: whether the layer's output gradient is gated too.
    """

    @property
    def structure(self):
        """What the compiled step depends on; values may change, this may not."""
        return (self.kind, self.table.shape, self.backprop)

    def values_at(self, step):
        """The mask in force at optimizer step `step`."""
        return self.table[int(np.searchsorted(self.boundaries, step, side="right"))]


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
        boundaries, interval_specs = spec.schedule()
        grouped = collections.defaultdict(lambda: ([], []))
        for interval, interval_spec in enumerate(interval_specs):
            for variable, mask, kind in interval_spec.resolve(layer):
                index = position.get(id(variable))
                if index is None:
                    continue
                if kind == "output":
                    key = (id(layer), "output")
                else:
                    key = (id(layer), "element", variable.path)
                    mask = np.broadcast_to(mask, tuple(variable.shape))
                indices, masks = grouped[key]
                if interval == 0:
                    indices.append(index)
                if len(masks) == interval:
                    masks.append(np.asarray(mask, np.float32))
        for key, (indices, masks) in grouped.items():
            for index in indices:
                if index in owner:
                    raise ValueError(
                        f"Variable '{variables[index].path}' is covered by the mask"
                        f" of layer '{owner[index].name}' and by that of layer"
                        f" '{layer.name}'. Declare its mask on one layer only."
                    )
                owner[index] = layer
            slots[key] = MaskSlot(
                layer=layer,
                kind=key[1],
                indices=tuple(indices),
                table=np.stack(masks),
                boundaries=tuple(boundaries),
                backprop=spec.backprop,
            )
    return slots


def resolve_masks(layer_specs, variables, step=0):
    """Maps positions in `variables` to `(layer, kind, mask)` at optimizer `step`.

    `mask` is a float32 array of shape `(units,)` for kind `"output"` and of the
    variable's shape for `"element"`. Raises as `plan_masks` does.
    """
    entries = {}
    for slot in plan_masks(layer_specs, variables).values():
        for index in slot.indices:
            entries[index] = (slot.layer, slot.kind, slot.values_at(step))
    return entries
