"""Blocks that a derivation must rebuild or call as the model does, for `test_derive_calls`.

Each reproduces, small, what keras_hub blocks do that a derivation which
rebuilds a layer from its config and calls it on its first input alone
cannot follow:

- `ExtraKeyFFN`: its `get_config` writes a key its `__init__` refuses
  (keras_hub's `GPTNeoXDecoder` writes `decoder_sequence_shape`);
- `LazyFFN`: its `build` makes no weight, its first call does (keras_hub's
  T5 and EdRec blocks);
- `SequenceNormFFN`: its `build` sizes a weight by the sequence axis, so a
  build at a shape with None there fails (keras_hub's Falcon and XLNet
  blocks, built at the shape they are called with);
- `TableFFN`: an optional position table of one row per position (its
  first axis no batch), which zeros of a batch of 2 cannot size, so the
  derivation falls back to the input alone (keras_hub's DINOv3 rotary tables);
- `BiasedAttention`: grouped attention called with a boolean mask (second
  positional argument) and an additive attention bias (keyword), both
  required (keras_hub's DeBERTa `rel_embeddings`, T5's position bias).

- `RotaryFFN`: a table of one row per position, whose symbolic shape in the
  model is wrong (1-D), so its zeros cannot stand for it and no call is
  traced (keras_hub's Moonshine rotary embedding: its `reshape` to
  `[None, -1]` gives a 1-D symbolic tensor for a 2-D table).

- `AutoNamedFFN`: sublayers named by Keras (`dense_3`...), numbered per
  process, so the worker numbers them otherwise (keras_hub's ViTDet blocks).

`build(cls)` puts one in a small model, as `derived_blocks.build` does.
"""

import keras
from keras import ops

from tests.helpers import derived_blocks as blocks

HIDDEN, SEQUENCE = blocks.HIDDEN, blocks.SEQUENCE


class ExtraKeyFFN(blocks.GatedFFN):
    def get_config(self):
        return {**super().get_config(), "seen_shape": [None, SEQUENCE, HIDDEN]}


class LazyFFN(blocks.GatedFFN):
    def __init__(self, units=6, **kwargs):
        super().__init__(units, gated=True, **kwargs)
        self.norm = keras.layers.LayerNormalization(name="norm")
        self.up = keras.layers.Dense(units, name="up")
        self.gate = keras.layers.Dense(units, use_bias=False, name="gate")
        self.down = keras.layers.Dense(HIDDEN, name="down")

    def get_config(self):
        config = super().get_config()
        del config["gated"]
        return config

    def build(self, shape):
        pass  # the sublayers build on their first call


class SequenceNormFFN(blocks.GatedFFN):
    """A `GatedFFN` with a scale per sequence position, sized at build."""

    def build(self, shape):
        super().build(shape)
        self.position_scale = self.add_weight(
            shape=(shape[1],), initializer="ones", name="position_scale"
        )

    def call(self, x):
        return super().call(x * self.position_scale[:, None])


class TableFFN(blocks.GatedFFN):
    def call(self, x, table=None):
        if table is not None:  # (positions, hidden): zeros of (2, hidden) do not fit
            x = x + ops.reshape(table, (-1, SEQUENCE, HIDDEN))
        return super().call(x)


class BiasedAttention(blocks.GroupedAttention):
    def attend(self, y, keep, bias):
        q, k, v = (self._project(d, y) for d in (self.query, self.key, self.value))
        group = self.heads // self.kv_heads
        k, v = ops.repeat(k, group, axis=2), ops.repeat(v, group, axis=2)
        scores = ops.einsum("bqnh,bknh->bnqk", q, k) + bias[:, None]
        scores = ops.where(keep[:, None], scores, -1e9)
        mixed = ops.einsum("bnqk,bknh->bqnh", ops.softmax(scores, axis=-1), v)
        return self.output_dense(mixed)

    def call(self, x, keep, bias):
        return x + self.attend(self.norm(x), keep, bias)


class RotaryFFN(blocks.GatedFFN):
    def call(self, x, table):
        return super().call(x * table[None, -SEQUENCE:, :1])

    def compute_output_shape(self, x_shape, table_shape):
        return x_shape


def build(cls, **kwargs):
    """A built block of `cls` in a model: `(model, block)`.

    `BiasedAttention` is called as `block(x, keep, bias=bias)` on model
    inputs; the others on `x` alone.
    """
    keras.utils.set_random_seed(0)
    x = keras.Input((SEQUENCE, HIDDEN))
    block = cls(name="block", **kwargs)
    if cls is BiasedAttention:
        keep = keras.Input((SEQUENCE, SEQUENCE), dtype="bool")
        bias = keras.Input((SEQUENCE, SEQUENCE))
        inputs, y = [x, keep, bias], block(x, keep, bias=bias)
    else:
        inputs, y = x, block(x)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(y))
    return model, block


class AutoNamedFFN(blocks.GatedFFN):
    """A `GatedFFN` whose sublayers take the names Keras makes up."""

    def build(self, shape):
        self.norm = keras.layers.LayerNormalization()
        self.norm.build(shape)
        self.up = keras.layers.Dense(self.units)
        self.up.build(shape)
        self.gate = keras.layers.Dense(self.units, use_bias=False)
        self.gate.build(shape)
        self.down = keras.layers.Dense(shape[-1])
        self.down.build(tuple(shape[:-1]) + (self.units,))
