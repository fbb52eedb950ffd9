"""Unit spaces read off propagated labels: which weight axes prune together.

A family of weight axes (nodes joined by `propagate`) is a unit space when:
it is not joined to the block's input or output (the residual stream,
which the block normalizes as a whole, stays); no operation stopped it
(`Labels.broken`); its positions fall into at least two units; and it holds
a weight axis that a `dot_general` contracts (an output projection: zeroing
a unit there cuts it off). A weight takes part in one space only, along its
outermost unit axis: a query kernel's heads axis, not its head-dim axis
(head-dim positions of all heads prune together only as a whole head). A
family some of whose weights prune along another axis is left out.
"""

from typing import NamedTuple

import numpy as np

__all__ = ["Entry", "Space", "unit_spaces"]


class Entry(NamedTuple):
    """One weight's part in a space: position `p` along `axis` is unit `ids[p]`."""

    weight: int
    axis: int
    ids: np.ndarray
    closes: bool


class Space(NamedTuple):
    """A derived unit space: `size` units and each weight's entries."""

    name: str
    size: int
    entries: tuple


def _weight_nodes(labels):
    return sorted(n for n in labels.sizes if isinstance(n[0], int))


def _families(labels):
    """`{family root: [weight nodes]}` and the roots joined to the input or output."""
    members = {}
    for node in _weight_nodes(labels):
        members.setdefault(labels.family(node), []).append(node)
    stays = {labels.family(n) for n in labels.sizes if not isinstance(n[0], int)}
    return members, stays


def _units(labels, nodes):
    """`{node: unit id per position}`, ids by first appearance, and their count."""
    number, ids = {}, {}
    for node in nodes:
        roots = [labels.position(node, p) for p in range(labels.sizes[node])]
        ids[node] = np.array([number.setdefault(r, len(number)) for r in roots])
    return ids, len(number)


def unit_spaces(labels, shapes):
    """The unit spaces of a block and why other families are not ones.

    Args:
      labels: `propagate`'s `Labels`.
      shapes: the weights' shapes, in the layer's weight order.

    Returns:
      `(spaces, reasons)`: a list of `Space`, and `{weight index: why its
      units do not prune}` for weights with two or more axes' positions
      in a family that stops (the operation that stops it).
    """
    members, stays = _families(labels)
    usable, units, reasons = {}, {}, {}
    for root, nodes in members.items():
        ids, count = _units(labels, nodes)
        units[root] = (ids, count)
        if root in stays or count < 2:
            continue
        if root in labels.broken:
            for weight, axis in nodes:
                reasons.setdefault(weight, f"axis {axis}: {labels.broken[root]}")
            continue
        usable[root] = nodes
    chosen = {}
    for root, nodes in usable.items():
        for weight, axis in nodes:
            if weight not in chosen or axis < chosen[weight][1]:
                chosen[weight] = (root, axis)
    spaces = []
    for root, nodes in sorted(usable.items(), key=lambda item: item[1][0]):
        weights = [w for w, _ in nodes]
        if len(set(weights)) != len(weights):
            continue  # a weight with two axes in one family: not a unit slice
        if any(chosen[w][0] != root for w in weights):
            continue
        if not any(node in labels.closes for node in nodes):
            continue
        ids, count = units[root]
        # Heads: a weight with a heads axis, or with several positions per unit
        # (a Dense's heads x head_dim columns); FFN units have one each.
        kind = (
            "heads"
            if any(
                len(shapes[w]) >= 3 or len(ids[n]) > count
                for w, n in zip(weights, nodes)
            )
            else "units"
        )
        entries = tuple(
            Entry(w, a, ids[(w, a)], (w, a) in labels.closes) for w, a in nodes
        )
        spaces.append(Space(kind, count, entries))
    named, seen = [], {}
    for space in spaces:
        k = seen[space.name] = seen.get(space.name, -1) + 1
        named.append(space._replace(name=space.name + (str(k) if k else "")))
    return named, reasons
