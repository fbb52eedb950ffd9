"""`size_report` traces each call at the shapes the calls before it computed.

One size for every unknown dimension does not fit a model whose lengths are
tied (a relative position table of twice the sequence, keras_hub's XLNet), a
layer that declares another rank than it returns (Moonshine's rotary table,
declared `(None,)`), or frames folded into the batch (VideoPrism): these
calls were left untraced, or counted for one frame.
"""

import keras
import pytest

import maskfit.pruning as pruning

pytestmark = pytest.mark.backends("tensorflow", "jax")


class _Twice(keras.layers.Layer):
    """The sequence and itself: a table twice its length."""

    def call(self, x):
        return keras.ops.concatenate([x, x], axis=1)


class _Relative(keras.layers.Layer):
    """Projects each half of a table twice the sequence's length."""

    def build(self, x_shape, table_shape):
        self.kernel = self.add_weight(shape=(x_shape[-1], 3))

    def call(self, x, table):
        halves = keras.ops.reshape(table, (-1, 2, keras.ops.shape(x)[1], x.shape[-1]))
        return keras.ops.einsum("bhld,de->blhe", halves, self.kernel)

    def compute_output_shape(self, x_shape, table_shape):
        return (x_shape[0], x_shape[1], 2, 3)


def test_a_table_twice_the_sequence_is_traced_at_its_length():
    x = keras.Input((None, 4))
    model = keras.Model(x, _Relative(name="relative")(x, _Twice(name="twice")(x)))
    report = pruning.size_report(model, model, unknown_size=5)
    assert report.notes == ()
    rows = {r.name: r for r in report.rows}
    assert rows["relative"].macs_before == 2 * 5 * 4 * 3  # halves x length x d x e


class _Table(keras.layers.Layer):
    """A (length, 4) table that declares the shape `(None,)`, as Moonshine's rotary one."""

    def call(self, x):
        return keras.ops.ones((keras.ops.shape(x)[1], 4))

    def compute_output_shape(self, x_shape):
        return (None,)


class _Scaled(keras.layers.Layer):
    """Scales `x` by the table's columns, then projects it."""

    def build(self, x_shape, table_shape):
        self.kernel = self.add_weight(shape=(x_shape[-1], 2))

    def call(self, x, table):
        return keras.ops.matmul(x * table[None, :, :4], self.kernel)

    def compute_output_shape(self, x_shape, table_shape):
        return (*x_shape[:-1], 2)


def test_a_layer_is_traced_at_the_rank_it_returns_not_the_one_it_declares():
    x = keras.Input((None, 4))
    model = keras.Model(x, _Scaled(name="scaled")(x, _Table(name="table")(x)))
    report = pruning.size_report(model, model, unknown_size=3)
    assert report.notes == ()
    assert report.macs_before == 3 * 4 * 2


class _Fold(keras.layers.Layer):
    """Folds the frames of each example into the batch."""

    def call(self, x):
        return keras.ops.reshape(x, (-1, x.shape[-1]))

    def compute_output_shape(self, x_shape):
        return (None, x_shape[-1])


def test_frames_folded_into_the_batch_count_for_each_example():
    frames = keras.Input((3, 4))
    folded = _Fold(name="fold")(frames)
    model = keras.Model(frames, [keras.layers.Dense(5, name="dense")(folded)])
    report = pruning.size_report(model, model)
    assert report.notes == ()
    assert report.macs_before == 3 * 4 * 5  # each of the 3 frames, not one
