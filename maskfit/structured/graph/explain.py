"""`DependencyGraph.explain`: per layer, which units can go and why the others stay."""

import collections

import numpy as np

__all__ = ["explain"]


def _layer(graph, layer):
    if layer is None or not isinstance(layer, str):
        return layer
    found = [l for l in graph._layers.values() if l.name == layer]
    if not found:
        names = sorted(l.name for l in graph._layers.values())
        raise ValueError(
            f"explain: model '{graph.model.name}' has no layer '{layer}' in its"
            f" graph. Its layers: {names[:30]}"
        )
    return found[0]


def _space_lines(graph, space):
    ids = space.ids
    atoms = graph.atoms_of(ids)
    removable = int(np.sum(atoms >= 0))
    what = "heads" if space.kind == "heads" else "units"
    head = f"  {space.size} {what} ({space.name})"
    if removable == space.size:
        group = graph.groups[graph.group_of_atom[atoms[0]]]
        others = [name for name in group.layers if name != space.layer.name]
        joined = f", together with {', '.join(others)}" if others else ""
        return [f"{head}: all removable (group {group.index}{joined})"]
    lines = [f"{head}: {removable} removable, {space.size - removable} stay:"]
    for reason, count in graph.reasons_of(ids).most_common():
        lines.append(f"    - {count} because {reason}")
    return lines


def explain(graph, layer=None):
    """Text: for each layer, its units (removable or not, and why) and notes."""
    layer = _layer(graph, layer)
    spaces = collections.defaultdict(list)
    for space in graph.spaces:
        spaces[id(space.layer)].append(space)
    layers = [layer] if layer is not None else list(graph._layers.values())
    blocks = []
    for each in layers:
        lines = [f"{each.name} ({type(each).__name__}):"]
        for space in spaces.get(id(each), ()):
            lines.extend(_space_lines(graph, space))
        for statement in graph._said.get(id(each), ()):
            lines.append(f"  {statement}")
        if len(lines) == 1:
            lines.append("  makes no units of its own; passes on the units it reads")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)
