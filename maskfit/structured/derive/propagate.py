"""Unit labels through a jaxpr: which positions of which weight axes go together.

Every axis of every weight is a node of positions. A label on an axis of an
intermediate value says, per position of that axis, which position of which
weight axis it carries (an index array; -1: none). Labels flow through the
equations, and wherever two labelled axes meet position by position (an
element-wise binary op, the contracted or batch axes of a `dot_general`),
their positions are joined (union-find). A residual add joins the block's
input to whatever it is added to; grouped key/value heads repeated to the
query heads (`broadcast_in_dim` + `reshape`) join each key/value head to
its whole group of query heads; a rotary embedding's halves (`slice` +
`concatenate`) join head-dim positions with each other, not across heads.

Where a labelled axis is reduced, gathered or passed to an operation this
module does not follow, its node family is marked broken with the
operation's name, so a coupling built from it is refused naming the op.
"""

import numpy as np

from maskfit.structured.derive import axes as derive_axes

__all__ = ["Labels", "propagate"]

# Primitives that keep their operands' shape and combine entries position by position.
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_REDUCTIONS = (
    "reduce_sum",
    "reduce_max",
    "reduce_min",
    "reduce_prod",
    "argmax",
    "argmin",
)


class Labels:
    """Union-find over weight-axis positions, with node families and their marks.

    Attributes:
      sizes: `{node: number of positions}`; a node is `(weight index, axis)`
        or `("input", axis)` / `("output", axis)` for the block's own tensors.
      broken: `{family root: the operation that stops the family}`.
      closes: nodes contracted directly by a `dot_general` (output projections).
    """

    def __init__(self):
        self.sizes = {}
        self._parent = {}
        self._family = {}
        self.broken = {}
        self.closes = set()

    def add(self, node, size):
        self.sizes[node] = size
        self._family[node] = node

    def _find(self, table, key):
        root = key
        while table.get(root, root) != root:
            root = table[root]
        while table.get(key, key) != root:
            table[key], key = root, table[key]
        return root

    def family(self, node):
        """The root of the family of nodes joined to `node`."""
        return self._find(self._family, node)

    def position(self, node, index):
        """The root of the set of positions joined to position `index` of `node`."""
        return self._find(self._parent, (node, int(index)))

    def join(self, a, b):
        """Joins position sets: `a`, `b` are `(node, index array)` of one axis."""
        (node_a, ia), (node_b, ib) = a, b
        fa, fb = self.family(node_a), self.family(node_b)
        if fa != fb:
            self._family[fa] = fb
            if fa in self.broken:
                self.broken.setdefault(fb, self.broken.pop(fa))
        for p, q in zip(ia, ib):
            if p >= 0 and q >= 0:
                ra, rb = self.position(node_a, p), self.position(node_b, q)
                if ra != rb:
                    self._parent[ra] = rb

    def break_(self, node, reason):
        self.broken.setdefault(self.family(node), reason)


def _join_axis(labels, axis_labels):
    """Joins every pair of labels on one axis (they meet position by position)."""
    for other in axis_labels[1:]:
        labels.join(axis_labels[0], other)


def _merge(columns):
    """Labels of one axis from several operands: one per node, the first kept."""
    seen, out = set(), []
    for label in columns:
        if label[0] not in seen:
            seen.add(label[0])
            out.append(label)
    return out


def _shape(var):
    return tuple(getattr(var.aval, "shape", ()))


def _fits(shape, out):
    """Whether `shape` broadcasts to `out` position by position (a scalar, or 1s)."""
    return shape == () or (
        len(shape) == len(out) and all(a in (b, 1) for a, b in zip(shape, out))
    )


def _elementwise(labels, eqn, env):
    shape = _shape(eqn.outvars[0])
    out = []
    for axis, size in enumerate(shape):
        column = []
        for var in eqn.invars:
            labelled = _get(env, var)
            if not labelled or _shape(var) == ():
                continue
            for node, index in labelled[axis]:
                if len(index) == 1 and size != 1:
                    index = np.repeat(index, size)
                column.append((node, index))
        _join_axis(labels, column)
        out.append(_merge(column))
    return out


def _dot_general(labels, eqn, env, weights):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars
    left = _get(env, lhs) or [[] for _ in _shape(lhs)]
    right = _get(env, rhs) or [[] for _ in _shape(rhs)]
    for var, axes in ((lhs, lc), (rhs, rc)):
        if not _literal(var) and var in weights:
            for axis in axes:
                labels.closes.add((weights[var], axis))
    for a, b in list(zip(lc, rc)) + list(zip(lb, rb)):
        _join_axis(labels, left[a] + right[b])
    out = [_merge(left[a] + right[b]) for a, b in zip(lb, rb)]
    out += [left[a] for a in range(len(left)) if a not in lc and a not in lb]
    out += [right[b] for b in range(len(right)) if b not in rc and b not in rb]
    return out


def _concatenate(labels, eqn, env):
    axis = eqn.params["dimension"]
    shapes = [_shape(v) for v in eqn.invars]
    operands = [_get(env, v) or [[] for _ in s] for v, s in zip(eqn.invars, shapes)]
    out = []
    for a in range(len(shapes[0])):
        if a != axis:
            column = [label for o in operands for label in o[a]]
            _join_axis(labels, column)
            out.append(_merge(column))
            continue
        nodes = {}
        offset = 0
        total = sum(s[axis] for s in shapes)
        for o, s in zip(operands, shapes):
            for node, index in o[a]:
                full = nodes.setdefault(node, np.full(total, -1))
                full[offset : offset + s[axis]] = index
            offset += s[axis]
        out.append(list(nodes.items()))
    return out


def _stack(labels, eqn, env):
    """`stack` (jax >= 0.4.36; rotary embeddings interleave halves with it).

    The operands meet position by position on every axis they have (joined,
    as by an element-wise op); the new axis, which indexes the operands,
    carries no weight's positions.
    """
    shape = _shape(eqn.invars[0])
    operands = [_get(env, v) or [[] for _ in shape] for v in eqn.invars]
    out = []
    for a in range(len(shape)):
        column = [label for o in operands for label in o[a]]
        _join_axis(labels, column)
        out.append(_merge(column))
    out.insert(eqn.params["axis"], [])
    return out


def _inner(eqn):
    for key in _CALL_PARAMS:
        inner = eqn.params.get(key)
        if inner is not None:
            return getattr(inner, "jaxpr", inner)
    return None


def _stop(labels, eqn, env, reason):
    for var in eqn.invars:
        for column in _get(env, var) or []:
            for node, _ in column:
                labels.break_(node, reason)


def run(labels, jaxpr, env, weights):
    """Propagates `env` (`{var: per-axis labels}`) through `jaxpr`'s equations."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [v for v in eqn.invars if hasattr(v, "aval") and not _literal(v)]
        if not any(_get(env, v) for v in ins):
            continue
        outs = _equation(labels, eqn, env, weights, name)
        for var, labelled in zip(eqn.outvars, outs):
            env[var] = labelled
        first = eqn.invars[0] if eqn.invars else None
        if name in ("convert_element_type", "copy") and _get(env, first) is not None:
            if first in weights:
                weights[eqn.outvars[0]] = weights[first]


def _literal(var):
    return type(var).__name__ == "Literal"


def _get(env, var):
    """The labels of `var` (None for a literal or an unlabelled value)."""
    return None if _literal(var) else env.get(var)


def _equation(labels, eqn, env, weights, name):
    shapes_out = [_shape(v) for v in eqn.outvars]
    operand = _get(env, eqn.invars[0]) if eqn.invars else None
    inner = _inner(eqn)
    if inner is not None and len(inner.invars) == len(eqn.invars):
        sub = {
            iv: _get(env, ov)
            for iv, ov in zip(inner.invars, eqn.invars)
            if _get(env, ov)
        }
        sub_weights = {
            iv: weights[ov]
            for iv, ov in zip(inner.invars, eqn.invars)
            if not _literal(ov) and ov in weights
        }
        run(labels, inner, sub, sub_weights)
        return [sub.get(v) for v in inner.outvars]
    if name == "dot_general":
        return [_dot_general(labels, eqn, env, weights)]
    if name == "broadcast_in_dim" and operand is not None:
        return [derive_axes.broadcast(eqn, operand)]
    if name == "reshape" and operand is not None and not eqn.params.get("dimensions"):
        return [derive_axes.reshape(labels, eqn, operand, _shape(eqn.invars[0]))]
    if name == "concatenate":
        return [_concatenate(labels, eqn, env)]
    if name == "stack":
        return [_stack(labels, eqn, env)]
    if name == "split" and operand is not None:
        return derive_axes.split(eqn, operand)
    if name in ("transpose", "squeeze", "slice") and operand is not None:
        return [derive_axes.axis_op(eqn, operand, _shape(eqn.invars[0]))]
    if name == "expand_dims" and operand is not None:
        out = list(operand)
        for axis in sorted(eqn.params["dimensions"]):
            out.insert(axis, [])
        return [out]
    if name in _REDUCTIONS:
        axes = eqn.params["axes"]
        for a in axes:
            for node, _ in operand[a]:
                labels.break_(node, f"'{name}' reduces over it")
        return [[c for a, c in enumerate(operand) if a not in axes]]
    shape = shapes_out[0] if shapes_out else None
    same = all(_fits(_shape(v), shape) for v in eqn.invars) and all(
        s == shape for s in shapes_out
    )
    if same and shape is not None:
        joined = _elementwise(labels, eqn, env)
        return [joined] * len(shapes_out)
    _stop(labels, eqn, env, f"'{name}' mixes its positions in a way not followed")
    return [None] * len(shapes_out)


def propagate(jaxpr, weight_vars, input_vars, output_vars):
    """Labels of a closed jaxpr's weights; the block's inputs and outputs joined too.

    Args:
      jaxpr: the `Jaxpr` of `f(*inputs, *weights)`.
      weight_vars: its invars of the weights, in the layer's weight order.
      input_vars, output_vars: the invars of the block's inputs, the outvars
        of its outputs (their nodes are named `("input", k, axis)`,
        `("output", k, axis)`).

    Returns:
      `Labels`.
    """
    labels = Labels()
    env, weights = {}, {}
    for w, var in enumerate(weight_vars):
        weights[var] = w
        env[var] = []
        for axis, size in enumerate(_shape(var)):
            labels.add((w, axis), size)
            env[var].append([((w, axis), np.arange(size))])
    for k, var in enumerate(input_vars):
        env[var] = []
        for axis, size in enumerate(_shape(var)):
            labels.add(("input", k, axis), size)
            env[var].append([(("input", k, axis), np.arange(size))])
    run(labels, jaxpr, env, weights)
    for k, var in enumerate(output_vars):
        for axis, size in enumerate(_shape(var)):
            node = ("output", k, axis)
            labels.add(node, size)
            for label in (_get(env, var) or [[]] * len(_shape(var)))[axis]:
                labels.join((node, np.arange(size)), label)
    return labels
