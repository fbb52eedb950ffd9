"""The specs declared on a model's layers, resolved against the step's variables.

`resolve_declared` turns each `(layer, spec)` into `DeclaredMask`s: which of
the step's variables a mask covers, and its values at every interval of its
schedule, as plain arrays read on the host. `maskfit.step.mask_state` keeps
them as state in the step; `resolve_masks` reads them for reports.
"""

import collections

import numpy as np

from maskfit.spec import masks as specs
from maskfit.spec import schedule

__all__ = ["DeclaredMask", "MaskEntry", "resolve_declared", "resolve_masks"]


class DeclaredMask(
    collections.namedtuple(
        "DeclaredMask",
        [
            "layer",
            "kind",
            "indices",
            "table",
            "boundaries",
            "backprop",
            "layouts",
            "scale",
        ],
    )
):
    """One declared mask, shared by the variables it covers.

    An `OutputMask` makes one mask of shape `(units,)` for all the variables
    of its layer that have entries owned by single units; each covered
    variable has a `UnitLayout` that expands the `(units,)` values onto it,
    in the step. An `ElementMask` makes one mask per named variable, of that
    variable's shape. Variables whose every entry is shared get none.

    Attributes:
      layer: the layer that carries the spec.
      kind: `"output"` or `"element"`.
      indices: positions of the covered variables in the step's variable list.
      table: array `(intervals, *mask_shape)`, one mask per interval: bool
        for an `ElementMask` of 0s and 1s (one byte per entry), else float32.
      boundaries: the steps at which the next interval starts (empty if fixed).
      backprop: whether the layer's output gradient is gated too.
      layouts: for `"output"`, one `UnitLayout` per index; else None.
      scale: what values other than 0 and 1 scale: `"step"` (the learning
        rate) or `"gradient"`.
    """

    @property
    def structure(self):
        """What the compiled step depends on; values may change, this may not."""
        layouts = (
            () if self.layouts is None else tuple(l.signature for l in self.layouts)
        )
        return (self.kind, self.table.shape, self.backprop, layouts, self.scale)

    def values_at(self, step):
        """The mask in force at optimizer step `step`."""
        return self.table[schedule.interval_at(self.boundaries, step)]

    def frozen_at(self, step, i, shape):
        """Where the mask freezes entries of its `i`-th variable (of `shape`) at `step`."""
        values = self.values_at(step)
        if self.layouts is not None:
            values = self.layouts[i].expand_numpy(values)
        return np.broadcast_to(values, shape) == 0


def _output_mask(layer, spec, position):
    """The mask of an `OutputMask` (or a schedule of them); None if nothing is owned."""
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
    return DeclaredMask(
        layer=layer,
        kind="output",
        indices=indices,
        table=np.stack([s.values for s in interval_specs]).astype(np.float32),
        boundaries=tuple(boundaries),
        backprop=spec.backprop,
        layouts=layouts,
        scale=spec.scale,
    )


def _element_masks(layer, spec, position):
    """One mask per named variable; its values keep the shape they were given.

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
                masks.append(
                    np.asarray(mask).reshape(
                        (1,) * (rank - np.ndim(mask)) + np.shape(mask)
                    )
                )
    declared = {}
    for key, (indices, masks) in grouped.items():
        shape = tuple(max(sizes) for sizes in zip(*(m.shape for m in masks)))
        if len(masks) == 1 and masks[0].shape == shape:
            table = masks[0][None]  # a view of the spec's own array
        else:
            table = np.stack([np.broadcast_to(m, shape) for m in masks])
        declared[key] = DeclaredMask(
            layer=layer,
            kind="element",
            indices=tuple(indices),
            table=table,
            boundaries=tuple(boundaries),
            backprop=spec.backprop,
            layouts=None,
            scale=spec.scale,
        )
    return declared


def _is_output(spec):
    return isinstance(spec.schedule()[1][0], specs.OutputMask)


def resolve_declared(layer_specs, variables):
    """Resolves `[(layer, spec)]` against the step's `variables`.

    Args:
      layer_specs: `[(layer, spec)]`, e.g. from `declare.masked_layers(model)`.
      variables: the trainable variables the step updates, in its order.

    Returns:
      A dict from a key (stable while the layer and its spec kind are) to its
      `DeclaredMask`.

    Raises:
      ValueError: when a spec does not fit its layer, a layer with a mask has no
        trainable variables, or two specs cover the same variable.
    """
    position = {id(v): i for i, v in enumerate(variables)}
    owner = {}
    resolved = {}
    for layer, spec in layer_specs:
        if not layer.trainable_weights:
            raise ValueError(
                f"Layer '{layer.name}' carries {spec!r} but has no trainable"
                " variables, so the mask would do nothing. Remove it with"
                " set_mask(layer, None), or set layer.trainable = True."
            )
        if _is_output(spec):
            mask = _output_mask(layer, spec, position)
            masks = {} if mask is None else {(id(layer), "output"): mask}
        else:
            masks = _element_masks(layer, spec, position)
        for key, mask in masks.items():
            for index in mask.indices:
                if index in owner:
                    raise ValueError(
                        f"Variable '{variables[index].path}' is covered by the mask"
                        f" of layer '{owner[index].name}' and by that of layer"
                        f" '{layer.name}'. Declare its mask on one layer only."
                    )
                owner[index] = layer
            resolved[key] = mask
    return resolved


class MaskEntry(
    collections.namedtuple("MaskEntry", ["layer", "kind", "mask", "shared"])
):
    """The mask on one variable at one step, for reports.

    Attributes:
      layer: the layer that carries the spec.
      kind: `"output"` or `"element"`.
      mask: float32 (or, for an `ElementMask` of 0s and 1s, bool) array that
        broadcasts to the variable (shared entries 1).
      shared: for `"output"`, a boolean array that broadcasts to the variable,
        True where the entry is shared by several units; else None.
    """


def resolve_masks(layer_specs, variables, step=0):
    """Maps positions in `variables` to their `MaskEntry` at optimizer `step`.

    Unlike `resolve_declared`, the variables of an `OutputMask` layer whose
    every entry is shared are included (mask 1, all shared). Raises as
    `resolve_declared`.
    """
    entries = {}
    for mask in resolve_declared(layer_specs, variables).values():
        values = mask.values_at(step)
        for i, index in enumerate(mask.indices):
            if mask.kind == "output":
                layout = mask.layouts[i]
                entries[index] = MaskEntry(
                    mask.layer, "output", layout.expand_numpy(values), layout.shared
                )
            else:
                entries[index] = MaskEntry(mask.layer, "element", values, None)
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
