"""Which removed units a derived layer's smaller config keeps, and why, in words.

`resize` searches a layer's config for the fields that hold its unit counts.
Where the config it takes (or the layer's own, if none passed) leaves some
weight axes at their old lengths, `shrink` warns; `stayed` says which unit
group those axes hold, the shape the cut needs, and the shapes the fields
that were tried gave instead: a head size computed as `hidden_dim //
num_heads` shows as `num_heads=1` giving a head axis twice the length the
cut needs.
"""

__all__ = ["stayed"]

# Fields whose shapes the message shows, at most.
_SHOWN = 4


def stayed(layer, counts, old, targets, kept, tried):
    """Words on the removed units of `layer` that stay, or "" where none do.

    Args:
      layer: the derived layer.
      counts: `(space name, size, kept)` per unit space of the layer.
      old: its weights' shapes.
      targets: their shapes with the removed units cut.
      kept: the shapes of the layer `shrink` makes (`old` where none passed).
      tried: `[(field name, value, shapes or None)]`: each single field
        substitution built, and the weight shapes it gave (None: it did not
        build).

    Returns:
      One sentence, e.g. "its heads (1 of 2 removed) stay: the cut needs
      weight 'attention/query/kernel' of shape (16, 1, 8) (axis 1: 2 -> 1),
      and no field that was tried gives it: num_heads=1 gave (16, 1, 16)".
    """
    stuck = [
        (w, a)
        for w, (o, t, k) in enumerate(zip(old, targets, kept))
        for a, (x, y, z) in enumerate(zip(o, t, k))
        if x != y and z == x
    ]
    if not stuck:
        return ""
    groups = []
    for w, a in stuck:
        group = _group(counts, old[w][a], targets[w][a])
        if group not in groups:
            groups.append(group)
    w, a = stuck[0]
    axes = ", ".join(
        f"axis {i}: {x} -> {y}"
        for i, (x, y) in enumerate(zip(old[w], targets[w]))
        if x != y and kept[w][i] == x
    )
    shown = [
        f"{name}={value} gave {tuple(shapes[w])}"
        for name, value, shapes in tried
        if shapes is not None and w < len(shapes)
    ]
    gave = (
        ": " + ", ".join(shown[:_SHOWN]) + (", ..." if len(shown) > _SHOWN else "")
        if shown
        else " (no smaller value of a field built a layer)"
    )
    return (
        f"its {' and '.join(groups)} stay: the"
        f" cut needs weight '{_path(layer, w)}' of shape {tuple(targets[w])}"
        f" ({axes}), and no config field that was tried gives it{gave}"
        + _computed(old[w], targets[w], a, tried, w)
    )


def _computed(old, target, axis, tried, w):
    """Where a field cuts `axis` but lengthens another: that length is computed."""
    for name, value, shapes in tried:
        if shapes is None or w >= len(shapes) or shapes[w][axis] != target[axis]:
            continue
        longer = [i for i, (n, o) in enumerate(zip(shapes[w], old)) if n > o]
        if longer:
            i = longer[0]
            return (
                f" ({name}={value} cuts axis {axis} but makes axis {i}"
                f" {shapes[w][i]} long, not {old[i]}: that length is computed"
                f" from {name}, as a head size of hidden_dim // num_heads is, so"
                " no field sets it alone)"
            )
    return ""


def _group(counts, length, cut):
    """The unit space an axis of `length` cut to `cut` holds, in words."""
    for name, size, kept in counts:
        if size == length and kept == cut:
            return f"{name} ({size - kept} of {size} removed)"
    for name, size, kept in counts:
        if size < length and length % size == 0 and length // size * kept == cut:
            each = length // size
            return f"{name} ({size - kept} of {size} removed, {each} entries each)"
    return f"units along an axis of {length} ({length - cut} removed)"


def _path(layer, index):
    path = layer.weights[index].path
    prefix = f"{layer.name}/"
    return path[path.index(prefix) + len(prefix) :] if prefix in path else path
