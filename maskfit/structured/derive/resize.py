"""A smaller config for a layer whose coupling is derived: found by search, then checked.

A derived coupling (`coupling.Derived`) says which entries of a layer's
weights belong to each unit, not which config fields hold the counts. So
`resized` searches the layer's config for them: every integer (in nested
lists and sub-layer configs too) that equals a weight axis's length or a
unit count that shrinks, or such a count times a factor no longer than a
weight axis (heads x head_dim), may hold one, and is given the smaller number. Single
substitutions are tried first, then every field of one value together,
then all, then a greedy walk that adds the substitution bringing most axes
to their cut lengths, then pairs and triples: at most `MAX_CANDIDATES`
layers built per search, each built symbolically (no weight initialized).

A candidate passes only when (1) every axis of every rebuilt weight has
its cut length (the removed units' entries left out) or its old one, and
(2) with the old weights cut along the shortened axes and their removed
entries 0 along the others, its output on a random probe input equals the
original layer's with the removed units' entries 0 (within 1e-5 of the
output's scale). One that cuts every axis is taken at once; otherwise the
passing one with the fewest parameters (a head size computed as
`hidden_dim // num_heads` lets no config say fewer heads, but says fewer FFN
units), and `shrink` warns that part of the layer keeps its size. The
outcome is kept per signature (class, config, weight shapes, input shape,
unit counts kept), so 22 identical blocks search once.
"""

import itertools

import keras
import numpy as np

from maskfit import internals
from maskfit.kinds.couplings import arguments as call_arguments
from maskfit.kinds.couplings import signature as check_signature
from maskfit.structured.derive import stayed as derive_stayed

__all__ = ["MAX_CANDIDATES", "Resized", "resized"]

# Layers built and run, at most, in one search.
MAX_CANDIDATES = 64

# What `shrink` reads (`Derived.couple` writes them): the shape the layer is
# called at, and its call's arguments (`arguments.describe`).
INPUT_SHAPE = "derived input shape"
ARGUMENTS = "derived call arguments"

_SEED, _RTOL = 0, 1e-5

# `{signature: (substitutions or None, fields tried, partial, why)}`.
_FOUND = {}


class Resized:
    """What `resized` found: the smaller layer (None: none passed), the fields tried,
    whether some removed units stay in it, at 0 (`partial`), and which and why,
    in words (`why`: `stayed.stayed`'s sentence, "" where it cannot tell)."""

    def __init__(self, layer, fields, partial=False, why=""):
        self.layer, self.fields, self.partial = layer, tuple(fields), partial
        self.why = why


def resized(layer, config, shrunk):
    """`layer` rebuilt from `config` with its derived units' counts cut, or None.

    Args:
      layer: a built layer whose coupling is derived.
      config: its config (as `from_config` takes it, unbuilt).
      shrunk: `shrink`'s view of what stays (`cut`, `fit`, `kept`, `note`,
        `graph.spaces`).

    Returns:
      A `Resized`: its `layer` is None where nothing is removed from
      `layer`, where the shape it is called at is unknown, or where no
      candidate passed both checks; `fields` names the config fields tried,
      `partial` says whether some removed units stay (at 0).
    """
    shape = shrunk.note(layer, INPUT_SHAPE)
    described = shrunk.note(layer, ARGUMENTS)
    weights = list(layer.weights)
    targets = [shrunk.cut(v).shape for v in weights]
    if shape is None or targets == [tuple(v.shape) for v in weights]:
        return Resized(None, ())
    counts = []
    for space in shrunk.graph.spaces:
        if space.layer is layer:
            counts.append((space.name, space.size, int(np.sum(shrunk.kept(space.ids)))))
    key = check_signature.signature(
        layer, tuple(shape), "resize", tuple(counts), call_arguments.key(described)
    )
    if key is not None and key in _FOUND:
        found, fields, partial, why = _FOUND[key]
    else:
        found, fields, partial, why = _search(
            layer, config, (shape, described), shrunk, targets, counts
        )
        if key is not None:
            _FOUND[key] = (found, fields, partial, why)
    if found is None:
        return Resized(None, fields, why=why)
    new = type(layer).from_config(_apply(config, found))
    return Resized(new, fields, partial, why)


def _search(layer, config, called, shrunk, targets, counts):
    """`(substitutions, fields tried, partial, why)`; substitutions None where none
    passed; `why` says which removed units stay and why (`stayed`).

    `called` is `(input shape, described arguments)`.

    A candidate passes where each weight axis has its old length or its cut
    one, and its outputs with the weights fitted (`shrunk.fit`) equal the
    masked layer's. One that cuts every axis ends the search; otherwise the
    one that leaves the fewest parameters is taken (`partial`).
    """
    old = [tuple(v.shape) for v in layer.weights]
    changes = _changes(old, targets, counts)
    lengths = {int(n) for v in old for n in v}
    fields = [
        (path, value, _options(value, changes, lengths))
        for path, value in _integers(config)
    ]
    fields = [(p, v, o) for p, v, o in fields if o]
    names = tuple(_name(p) for p, _, _ in fields)
    if not fields:
        return None, names, False, ""
    shape, described = called
    rng = np.random.default_rng(_SEED)
    x = rng.normal(size=call_arguments.concrete(shape))
    x = x.astype("float32")
    try:
        expected = _outputs(
            layer, x, described, [shrunk.zeroed(v) for v in layer.weights]
        )
    except Exception:  # noqa: BLE001 - a layer that cannot run alone keeps its size
        return None, names, False, ""
    full = sum(len(t) for t in targets)
    tried, passed = {}, {}  # subs -> axes at their cut length; subs -> parameters
    made_by = {}  # subs -> the weight shapes its layer has

    def attempt(subs):
        subs = tuple(sorted(set(subs), key=repr))  # paths may mix keys and indices
        if subs in tried or len(tried) >= MAX_CANDIDATES:
            return tried.get(subs, -1)
        tried[subs] = -1
        new = _built(type(layer), _apply(config, subs), x, described)
        if new is None:  # a config that does not build is not it
            return -1
        made = made_by[subs] = [tuple(v.shape) for v in new.weights]
        if len(made) != len(targets) or any(
            len(m) != len(t) for m, t in zip(made, targets)
        ):
            return -1
        tried[subs] = sum(a == b for m, t in zip(made, targets) for a, b in zip(m, t))
        fits = all(
            a in (b, c)
            for m, t, o in zip(made, targets, old)
            for a, b, c in zip(m, t, o)
        )
        size = sum(int(np.prod(m)) for m in made)
        better = fits and size < min(passed.values(), default=sum(map(np.prod, old)))
        cut = [shrunk.fit(v, m) for v, m in zip(layer.weights, made)]
        if better and _same_outputs(new, x, described, cut, expected):
            passed[subs] = size
        return tried[subs]

    def complete():
        return any(tried[s] == full for s in passed)

    singles = [((p, o),) for p, _, options in fields for o in options]
    by_value = {}
    for path, value, options in fields:
        for option in options:
            by_value.setdefault((value, option), []).append((path, option))
    groups = [tuple(g) for g in by_value.values() if len(g) > 1]
    everything = [tuple((p, o[0]) for p, _, o in fields)]
    for subs in singles + groups + everything:
        attempt(subs)
        if complete():
            break
    current = max(tried, key=tried.get) if tried else ()
    while tried and not complete() and len(tried) < MAX_CANDIDATES:
        taken = {p for p, _ in current}
        steps = [current + one for one in singles if one[0][0] not in taken]
        if not steps:
            break
        best = max(steps, key=attempt)
        if complete() or attempt(best) <= tried[current]:
            break
        current = tuple(sorted(best, key=repr))
    firsts = [((p, o[0]),) for p, _, o in fields]
    for size in (2, 3):
        for combo in itertools.combinations(firsts, size):
            if complete() or len(tried) >= MAX_CANDIDATES:
                break
            attempt(sum(combo, ()))
    found, partial = _best(passed, tried, full)
    kept = made_by[found] if found is not None else old
    singles_made = [
        (_name(p), o, made_by.get(((p, o),)))
        for ((p, o),) in singles
        if ((p, o),) in tried
    ]
    why = derive_stayed.stayed(layer, counts, old, targets, kept, singles_made)
    return found, names, partial, why


def _best(passed, tried, full):
    """`(substitutions, partial)` of the passing candidate with fewest parameters."""
    if not passed:
        return None, False
    found = min(passed, key=passed.get)
    return found, tried[found] != full


def _changes(old, targets, counts):
    """`[(old, new)]`: weight axis lengths, then unit counts (`counts`:
    `(name, size, kept)` per unit space of the layer), that shrink."""
    found = []
    for shape, target in zip(old, targets):
        for a, b in zip(shape, target):
            if a != b and (a, b) not in found:
                found.append((int(a), int(b)))
    for _, size, kept in counts:
        if size != kept and (size, kept) not in found:
            found.append((size, kept))
    return found


def _options(value, changes, lengths):
    """The smaller numbers `value` may become.

    First where it equals a count that shrinks, then where it is such a
    count times a factor no longer than a weight axis (heads x head_dim,
    query heads x heads per key/value group; a sequence length of 4096 is
    not 2 key/value heads x 2048).
    """
    options = [new for old, new in changes if old == value]
    for old, new in changes:
        if value != old and value % old == 0 and value // old <= max(lengths):
            options.append(value // old * new)
    return list(dict.fromkeys(o for o in options if o > 0 and o != value))


def _integers(config, path=()):
    """`[(path, value)]` of every integer in `config` (bools left out)."""
    if isinstance(config, dict):
        return [
            found
            for key, value in config.items()
            for found in _integers(value, path + (key,))
        ]
    if isinstance(config, (list, tuple)):
        return [
            found
            for i, value in enumerate(config)
            for found in _integers(value, path + (i,))
        ]
    if isinstance(config, int) and not isinstance(config, bool) and config > 0:
        return [(path, config)]
    return []


def _name(path):
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)[1:] or "?"


def _apply(config, subs):
    """A copy of `config` with each `(path, value)` of `subs` set."""

    def put(node, path, value):
        if not path:
            return value
        head, rest = path[0], path[1:]
        if isinstance(node, dict):
            return {**node, head: put(node[head], rest, value)}
        items = list(node)
        items[head] = put(items[head], rest, value)
        return type(node)(items)

    for path, value in subs:
        config = put(config, path, value)
    return config


def _built(cls, config, x, described):
    """A layer of `cls` from `config`, built at `x`'s shape, or None if that fails.

    Built symbolically in a `StatelessScope`: its variables have shapes and
    no values (no initializer runs, nothing is computed or compiled).
    """
    try:
        with internals.shapes_only():
            new = cls.from_config(config)
            symbolic = keras.KerasTensor(x.shape, x.dtype)
            call_arguments.call(new, described, symbolic, keras.KerasTensor)
        return new
    except Exception:  # noqa: BLE001 - whatever fails, this config is not it
        return None


def _outputs(layer, x, described, values):
    """`layer(x, ...)` with its weights set to `values` (the layer's own stay untouched).

    Under JAX, jitted: one compilation instead of one per operation.
    """

    def run(arrays, x):
        with keras.StatelessScope(state_mapping=list(zip(layer.weights, arrays))):
            return keras.tree.flatten(call_arguments.call(layer, described, x))

    if keras.backend.backend() == "jax":
        import jax

        try:
            found = jax.jit(run)(values, x)
        except Exception:  # noqa: BLE001 - a call that does not jit runs op by op
            found = run(values, x)
    else:
        found = run(values, x)
    return [np.asarray(keras.ops.convert_to_numpy(y), np.float64) for y in found]


def _same_outputs(new, x, described, cut, expected):
    try:
        outputs = _outputs(new, x, described, cut)
    except Exception:  # noqa: BLE001
        return False
    if len(outputs) != len(expected):
        return False
    for a, b in zip(outputs, expected):
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        if a.shape != b.shape or not np.all(np.abs(a - b) <= _RTOL * scale + 1e-12):
            return False
    return True
