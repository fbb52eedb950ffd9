"""Small custom blocks that no record or spec names, for the derived couplings' tests.

Each is a subclassed layer over `Dense` / `EinsumDense` sublayers that
`maskfit.structured.derive` must read from its computation alone:

- `GatedFFN`: `down(silu(gate(x)) * up(x))` with a residual add (or an
  ungated GELU FFN);
- `GroupedAttention`: grouped-query attention with a separate `head_dim`,
  key/value heads repeated to their query heads, a rotary embedding (by
  halves, or by `stack` as keras_hub's), a residual add; with `fused`,
  `Dense` projections of heads x head_dim columns reshaped into heads;
- `ParallelBlock`: attention and FFN side by side on one normalized input,
  added to the residual (GPT-NeoX, Phi style);
- `ReducedFFN`: an FFN whose hidden units are summed over (`ops.sum` on the
  unit axis), which derivation must refuse naming the operation;
- `ForgetfulFFN`: a config without its width (a JAX worker cannot rebuild it).

`recorded(coupling, layer)` and `derived(layer, shape)` put a hand-written
keras_hub spec and a derived coupling in one comparable form.
"""

import keras
import numpy as np
from keras import ops

HIDDEN, SEQUENCE = 8, 5


class GatedFFN(keras.layers.Layer):
    def __init__(self, units=6, gated=True, **kwargs):
        super().__init__(**kwargs)
        self.units, self.gated = units, gated

    def get_config(self):
        return {**super().get_config(), "units": self.units, "gated": self.gated}

    def build(self, shape):
        self.norm = keras.layers.LayerNormalization(name="norm")
        self.norm.build(shape)
        self.up = keras.layers.Dense(self.units, name="up")
        self.up.build(shape)
        if self.gated:
            self.gate = keras.layers.Dense(self.units, use_bias=False, name="gate")
            self.gate.build(shape)
        self.down = keras.layers.Dense(shape[-1], name="down")
        self.down.build(tuple(shape[:-1]) + (self.units,))

    def call(self, x):
        y = self.norm(x)
        h = self.up(y)
        h = h * ops.silu(self.gate(y)) if self.gated else keras.activations.gelu(h)
        return x + self.down(h)


def _rotate(x, form):
    """A rotary embedding on the last axis (head_dim), positions on axis 1.

    `form` "halves" rotates by slices and a concatenation; "stack" as
    keras_hub's `RotaryEmbedding` does (split, `stack` of the negated and
    the first half, reshape back).
    """
    half = x.shape[-1] // 2
    positions = ops.arange(x.shape[1], dtype="float32")[:, None, None]
    angles = positions * (1.0 + ops.arange(half, dtype="float32"))
    if form == "stack":
        angles = ops.concatenate([angles, angles], -1)
        first, second = ops.split(x, 2, axis=-1)
        turned = ops.reshape(ops.stack([-second, first], axis=-2), ops.shape(x))
        return x * ops.cos(angles) + turned * ops.sin(angles)
    cos, sin = ops.cos(angles), ops.sin(angles)
    first, second = x[..., :half], x[..., half:]
    return ops.concatenate([first * cos - second * sin, second * cos + first * sin], -1)


class GroupedAttention(keras.layers.Layer):
    def __init__(
        self, heads=4, kv_heads=2, head_dim=4, rotary="stack", fused=False, **kwargs
    ):
        super().__init__(**kwargs)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.rotary, self.fused = rotary, fused

    def get_config(self):
        names = ("heads", "kv_heads", "head_dim", "rotary", "fused")
        return {**super().get_config(), **{n: getattr(self, n) for n in names}}

    def _build_dense(self, shape):
        """Dense projections of heads x head_dim columns, reshaped into heads."""
        width = self.head_dim
        self.query = keras.layers.Dense(self.heads * width, name="query")
        self.key = keras.layers.Dense(self.kv_heads * width, name="key")
        self.value = keras.layers.Dense(self.kv_heads * width, name="value")
        for dense in (self.query, self.key, self.value):
            dense.build(shape)
        self.output_dense = keras.layers.Dense(shape[-1], name="attention_output")
        self.output_dense.build(tuple(shape[:-1]) + (self.heads * width,))

    def _project(self, dense, y):
        if not self.fused:
            return dense(y)
        return ops.reshape(dense(y), ops.shape(y)[:2] + (-1, self.head_dim))

    def build(self, shape):
        d = shape[-1]
        self.norm = keras.layers.LayerNormalization(name="norm")
        self.norm.build(shape)
        if self.fused:
            return self._build_dense(shape)
        make = keras.layers.EinsumDense
        self.query = make(
            "btd,dnh->btnh", (None, self.heads, self.head_dim), name="query"
        )
        self.key = make(
            "btd,dnh->btnh", (None, self.kv_heads, self.head_dim), name="key"
        )
        self.value = make(
            "btd,dnh->btnh", (None, self.kv_heads, self.head_dim), name="value"
        )
        self.output_dense = make("btnh,nhd->btd", (None, d), name="attention_output")
        for dense in (self.query, self.key, self.value):
            dense.build(shape)
        self.output_dense.build(tuple(shape[:2]) + (self.heads, self.head_dim))

    def attend(self, y):
        q, k, v = (self._project(d, y) for d in (self.query, self.key, self.value))
        if self.rotary:
            q, k = _rotate(q, self.rotary), _rotate(k, self.rotary)
        group = self.heads // self.kv_heads
        k, v = ops.repeat(k, group, axis=2), ops.repeat(v, group, axis=2)
        scores = ops.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(self.head_dim)
        mixed = ops.einsum("bnqk,bknh->bqnh", ops.softmax(scores, axis=-1), v)
        if self.fused:
            mixed = ops.reshape(mixed, ops.shape(mixed)[:2] + (-1,))
        return self.output_dense(mixed)

    def call(self, x):
        return x + self.attend(self.norm(x))


class ParallelBlock(GroupedAttention):
    def build(self, shape):
        super().build(shape)
        self.ffn = GatedFFN(6, gated=False, name="ffn")
        self.ffn.build(shape)

    def call(self, x):
        y = self.norm(x)
        # GatedFFN adds its own input: subtract it so the FFN's part is its output alone.
        return x + self.attend(y) + (self.ffn(y) - y)


class ReducedFFN(GatedFFN):
    def call(self, x):
        h = self.up(self.norm(x))
        return x + self.down(h) * ops.sum(h, axis=-1, keepdims=True)


class ForgetfulFFN(GatedFFN):
    """A `GatedFFN` whose config forgets its width: it rebuilds other weights."""

    def get_config(self):
        config = super().get_config()
        del config["units"]
        return config


def build(cls, **kwargs):
    """A built block of `cls` on inputs `(None, SEQUENCE, HIDDEN)`, in a model."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((SEQUENCE, HIDDEN))
    block = cls(name="block", **kwargs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(block(inputs)))
    return model, block


def _canonical(entries):
    """Entries `(path, axis, ids, closes)`, ids renumbered by first appearance."""
    entries = sorted(entries, key=lambda e: (e[0], e[1]))
    number = {}
    out = []
    for path, axis, ids, closes in entries:
        renamed = tuple(number.setdefault(int(i), len(number)) for i in ids)
        out.append((path, axis, renamed, bool(closes)))
    return tuple(out)


def derived(layer, shape):
    """The derived coupling of `layer` as `{canonical entries of each space}`."""
    from maskfit.structured.derive import coupling

    spaces, _, _ = coupling.derive(layer, shape)
    return {
        _canonical(
            [(layer.weights[e.weight].path, e.axis, e.ids, e.closes) for e in s.entries]
        )
        for s in spaces
    }


class _Recorder:
    """The part of a `DependencyGraph` a `HubBlock` writes its spaces to."""

    def __init__(self):
        self.spaces, self.memo = [], None
        self._next = 0

    def new_space(self, layer, name, size, kind="units"):
        space = type("Space", (), {})()
        space.first, space.size, space.name = self._next, size, name
        space.ids = np.arange(self._next, self._next + size)
        self._next += size
        self.spaces.append([])
        return space

    def slice(self, layer, variable, axis, ids, scored=True):
        self.spaces[-1].append((variable.path, axis % len(variable.shape), ids))

    def note(self, *args):
        pass

    def fix(self, ids, reason):
        pass


def recorded(coupling, layer):
    """A keras_hub spec's coupling of `layer` in `derived`'s form."""
    graph = _Recorder()
    closes = {"attention_output", "feedforward_output_dense", "ffw_linear", "dense_2"}
    for prefix, path in coupling._blocks(layer):
        from maskfit.kinds.couplings.parts import sublayer

        attention = sublayer(layer, path + coupling.spec.attention.path)
        coupling._heads(graph, layer, prefix, attention)
        coupling._ffn(graph, layer, prefix, path)
    found = set()
    for entries in graph.spaces:
        found.add(
            _canonical(
                [(p, a, ids, p.split("/")[-2] in closes) for p, a, ids in entries]
            )
        )
    return found
