"""What the couplings share: reading units, making a layer's own, checking them.

`read_units` gives the unit nodes a layer reads along an axis of its input;
`own_units` makes the space of units a layer makes and slices its own
variables; `check_own` checks those slices against the layer's real
gradients (`maskfit.units.layout.layer_units`, the output-unit self-check);
`declared_units` makes a custom layer's units from its output-unit
declaration.
"""

import numpy as np

from maskfit import internals
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.units import layout as units_lib

__all__ = [
    "check_own",
    "declared_units",
    "named_variable",
    "no_units",
    "own_units",
    "read_units",
    "sublayer",
    "unsupported",
    "variable",
]


def sublayer(layer, path):
    """The sublayer of `layer` at `path` (names), or None."""
    for name in path:
        layer = next(
            (s for s in internals.sublayers(layer, recursive=False) if s.name == name),
            None,
        )
        if layer is None:
            return None
    return layer


def variable(layer, name):
    """The variable of `layer` (itself, not its sublayers) called `name`, or None."""
    return next((v for v in layer.weights if v.name == name), None)


def named_variable(layer, name):
    """The one variable of `layer` whose name or path is `name` (a `UnitCoupling`'s)."""
    found = [v for v in layer.weights if name in (v.name, v.path)]
    if len(found) != 1:
        raise ValueError(
            f"The unit coupling of layer '{layer.name}' names variable '{name}',"
            f" which matches {len(found)} of its variables"
            f" {[v.path for v in layer.weights]}. Name one of them."
        )
    return found[0]


def no_units(layer, why):
    return TensorUnits.none(f"output of '{layer.name}', which {why}")


def read_units(call, graph, source, axis):
    """The unit nodes a layer reads along `axis` of `source` (-1 where none).

    Units that `source` carries on another axis are fixed: the layer reads
    them along a different axis than the one they are on.
    """
    layer = call.layer
    if source is None:
        return None
    shape = call.input_shape(0)
    width = shape[axis] if -len(shape) <= axis < 0 else None
    if source.ids is None:
        return None if width is None else np.full(width, -1, np.int64)
    if source.axis != axis:
        graph.fix(
            source.ids,
            f"read by '{layer.name}' along axis {axis}, while its units are on"
            f" axis {source.axis}",
        )
        return None if width is None else np.full(width, -1, np.int64)
    return source.ids


def check_own(graph, layer, space, owned):
    """Checks the layer's own slices against its real gradients (`layer_units`).

    Every entry that the output-unit self-check finds belongs to unit `u`
    must be in unit `u`'s slice; a layer whose units fail the check (a
    softmax activation mixes them) keeps them all, with the check's reason.

    Args:
      owned: `{id(variable): (axis, ids)}`, the slices recorded for `space`.
    """
    try:
        checked = units_lib.layer_units(layer)
    except Exception as error:  # noqa: BLE001 - whatever stops the check keeps the units
        graph.fix(space.ids, f"its units fail maskfit's gradient check: {error}")
        return
    if checked.units != space.size:
        raise ValueError(
            f"The coupling of '{layer.name}' makes {space.size} units, but its"
            f" output-unit declaration says {checked.units}; this is a bug."
        )
    for var, layout in checked.layouts:
        if layout is None:
            continue
        index = np.broadcast_to(layout.index, tuple(var.shape))
        belongs = index < checked.units
        if not belongs.any():
            continue
        axis, ids = owned.get(id(var), (None, None))
        shape = [1] * len(var.shape)
        if axis is not None:
            shape[axis] = -1
            declared = np.broadcast_to((ids - space.first).reshape(shape), index.shape)
        if axis is None or np.any(belongs & (declared != index)):
            raise ValueError(
                f"The unit coupling of '{layer.name}' ({type(layer).__name__})"
                f" disagrees with its gradients on '{var.path}'; this is a bug in"
                " its coupling."
            )


def own_units(graph, layer, size, slices, name="units", kind="units", check=True):
    """Makes `layer`'s space of `size` units and slices its own variables.

    Args:
      slices: `{variable name: (axis, blocks)}`: position `p` along `axis`
        belongs to unit `p % size` (gate blocks side by side); variables
        the layer lacks are skipped. Biases are not scored.
    """
    space = graph.new_space(layer, name, size, kind)
    owned = {}
    for var_name, (axis, blocks) in slices.items():
        var = variable(layer, var_name)
        if var is not None:
            ids = np.tile(space.ids, blocks)
            graph.slice(layer, var, axis, ids, scored="bias" not in var_name)
            owned[id(var)] = (axis % len(var.shape), ids)
    if check:
        check_own(graph, layer, space, owned)
    return space


def declared_units(call, graph):
    """The units a custom layer makes, from its checked output-unit declaration."""
    layer = call.layer
    try:
        checked = units_lib.layer_units(layer)
    except Exception as error:  # noqa: BLE001
        why = f"has units that fail maskfit's check: {error}"
        return [no_units(layer, why)] * call.num_outputs
    space = graph.new_space(layer, "units", checked.units)
    for var, layout in checked.layouts:
        if layout is None:
            continue
        varying = [a for a, d in enumerate(layout.index.shape) if d > 1]
        if layout.has_shared or len(varying) != 1:
            graph.fix(
                space.ids,
                f"'{var.path}' mixes the entries of several units along one axis,"
                " so a unit cannot be cut out of it",
            )
            continue
        ids = space.first + layout.index.reshape(-1).astype(np.int64)
        graph.slice(layer, var, varying[0], ids, scored="bias" not in var.name)
    made = []
    for i, tensor in enumerate(call.call.outputs):
        segment = checked.outputs[i] if i < len(checked.outputs) else None
        if segment is None:
            made.append(no_units(layer, "carries no units in this output"))
            continue
        axis, start, _ = segment
        rank = len(tensor.shape)
        size = tensor.shape[axis]
        made.append(TensorUnits(axis % rank - rank, space.ids[start : start + size]))
    return made


def unsupported(layer):
    mode = getattr(layer.dtype_policy, "quantization_mode", None)
    if mode is not None:
        return f"is quantized ({mode}); prune before quantizing"
    if getattr(layer, "lora_enabled", False):
        return "has LoRA enabled; prune it before enabling LoRA"
    return None
