"""Unit labels through the operations that move axes: which axis each position lands on.

`broadcast_in_dim`, `reshape` (a dim split into heads x head_dim, or merged
back), `transpose`, `squeeze`, `slice` and `split` keep every position of a
weight axis but may move it to another axis or drop it; the labels (per
axis: `(node, positions)`) follow. Helpers of `propagate`.
"""

import numpy as np

__all__ = ["axis_op", "broadcast", "reshape", "split"]


def broadcast(eqn, operand):
    shape = eqn.params["shape"]
    out = [[] for _ in shape]
    for axis, target in enumerate(eqn.params["broadcast_dimensions"]):
        for node, index in operand[axis]:
            if len(index) == 1 and shape[target] != 1:
                index = np.repeat(index, shape[target])
            out[target].append((node, index))
    return out


def reshape(labels, eqn, operand, shape_in):
    """Labels after a reshape: each group of axes with one product, re-cut."""
    shape_out = tuple(eqn.params["new_sizes"])
    out = [[] for _ in shape_out]
    i = j = 0
    while i < len(shape_in) or j < len(shape_out):
        gi, gj = [i], [j]
        pi = shape_in[i] if i < len(shape_in) else 1
        pj = shape_out[j] if j < len(shape_out) else 1
        while pi != pj:
            if pi < pj:
                i += 1
                gi.append(i)
                pi *= shape_in[i]
            else:
                j += 1
                gj.append(j)
                pj *= shape_out[j]
        gi = [a for a in gi if a < len(shape_in)]
        gj = [b for b in gj if b < len(shape_out)]
        sub_in = [shape_in[a] for a in gi]
        sub_out = [shape_out[b] for b in gj]
        for k, axis in enumerate(gi):
            for node, index in operand[axis]:
                full = np.broadcast_to(
                    np.reshape(index, [-1 if m == k else 1 for m in range(len(gi))]),
                    sub_in,
                ).reshape(sub_out)
                _recut(labels, node, full, gj, out)
        i, j = i + 1, j + 1
    return out


def _recut(labels, node, full, axes, out):
    """Puts `full` (node positions over a group of axes) on the axis it varies along."""
    varying = [
        m for m in range(full.ndim) if np.any(full != np.take(full, [0], axis=m))
    ]
    if not varying:
        if full.size:
            for b, size in zip(axes, full.shape):
                if size == 1:
                    out[b].append((node, full.reshape(-1)[:1]))
                    return
        return
    m = varying[0]  # the outermost: an inner axis split off it stays in its units
    moved = np.moveaxis(full, m, 0).reshape(full.shape[m], -1)
    for row in moved:
        labels.join((node, row[:1].repeat(len(row))), (node, row))
    out[axes[m]].append((node, moved[:, 0]))


def axis_op(eqn, operand, shape):
    """`transpose`, `squeeze`, `slice`, `concatenate`-free axis bookkeeping."""
    name, params = eqn.primitive.name, eqn.params
    if name == "transpose":
        return [operand[p] for p in params["permutation"]]
    if name == "squeeze":
        return [c for a, c in enumerate(operand) if a not in params["dimensions"]]
    if name == "slice":
        strides = params["strides"] or (1,) * len(shape)
        return [
            [(node, index[s:e:st]) for node, index in column]
            for column, s, e, st in zip(
                operand, params["start_indices"], params["limit_indices"], strides
            )
        ]
    return None


def split(eqn, operand):
    """`split` (jax >= 0.4.36; older jaxprs slice): each piece's positions."""
    axis, outs, offset = eqn.params["axis"], [], 0
    for size in eqn.params["sizes"]:
        piece = list(operand)
        piece[axis] = [(n, index[offset : offset + size]) for n, index in operand[axis]]
        outs.append(piece)
        offset += size
    return outs
