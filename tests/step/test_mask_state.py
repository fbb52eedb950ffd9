"""Unit tests of `maskfit.step.mask_state` and `maskfit.step.declared`."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import maskfit
from maskfit.step import declared as declared_lib
from maskfit.step import mask_state


def test_where_masked_gives_plus_zero_where_dropped_even_for_nan_and_inf():
    values = tf.constant([np.nan, np.inf, -3.0, -0.0, 2.5])
    for mask in ([0, 0, 0, 0, 1], [False, False, False, False, True]):
        out = mask_state.where_masked(values, tf.constant(mask)).numpy()
        np.testing.assert_array_equal(out[:4].view(np.uint32), np.zeros(4, np.uint32))
        assert out[4] == 2.5


# (Subnormal values are left out: TensorFlow's CPU kernels flush them to 0,
# in every op, so stock Keras sees them as 0 too.)
@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.floats(-1e6, 1e6, width=32, allow_subnormal=False), min_size=1, max_size=20
    )
)
def test_where_masked_keeps_kept_values_bit_for_bit(values):
    values = np.asarray(values, np.float32)
    out = mask_state.where_masked(tf.constant(values), tf.ones(values.shape, tf.bool))
    np.testing.assert_array_equal(out.numpy().view(np.uint32), values.view(np.uint32))


def test_mask_gradient_gathers_rows_of_sparse_gradients():
    mask = tf.constant([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    sparse = tf.IndexedSlices(tf.ones((2, 2)), tf.constant([2, 1]), tf.constant([3, 2]))
    out = mask_state.mask_gradient(sparse, mask)
    assert isinstance(out, tf.IndexedSlices)
    np.testing.assert_array_equal(out.values.numpy(), [[1, 0], [0, 0]])
    broadcast = mask_state.mask_gradient(sparse, tf.constant([[0.0, 1.0]]))
    np.testing.assert_array_equal(broadcast.values.numpy(), [[0, 1], [0, 1]])


def test_is_frozen_for_bool_and_number_masks():
    np.testing.assert_array_equal(
        mask_state.is_frozen(tf.constant([True, False])).numpy(), [False, True]
    )
    np.testing.assert_array_equal(
        mask_state.is_frozen(tf.constant([0.0, 0.5])).numpy(), [True, False]
    )


def _dense(units=3, inputs=2, name="d"):
    layer = keras.layers.Dense(units, name=name)
    layer.build((None, inputs))
    return layer


def test_resolve_declared_for_output_element_and_scheduled_masks():
    a, b = _dense(name="a"), _dense(name="b")
    variables = a.trainable_weights + b.trainable_weights
    specs = [
        (a, maskfit.OutputMask([1, 0, 1])),
        (
            b,
            maskfit.PiecewiseMask(
                [5],
                [
                    maskfit.ElementMask({"kernel": np.zeros((2, 3))}),
                    maskfit.ElementMask({"kernel": np.ones((2, 3))}),
                ],
            ),
        ),
    ]
    found = declared_lib.resolve_declared(specs, variables)
    output = found[(id(a), "output")]
    assert output.indices == (0, 1) and output.kind == "output"
    np.testing.assert_array_equal(output.table, [[1, 0, 1]])
    element = found[(id(b), "element", b.kernel.path)]
    assert element.indices == (2,) and element.boundaries == (5,)
    assert element.table.shape == (2, 2, 3)
    np.testing.assert_array_equal(element.values_at(4), np.zeros((2, 3)))
    np.testing.assert_array_equal(element.values_at(5), np.ones((2, 3)))


def test_two_masks_on_one_variable_are_refused():
    a = _dense()
    specs = [
        (a, maskfit.ElementMask({"kernel": 1})),
        (a, maskfit.OutputMask([1, 1, 1])),
    ]
    with pytest.raises(ValueError, match="covered by the mask of layer 'd' and by"):
        declared_lib.resolve_declared(specs, a.trainable_weights)


def test_resolve_masks_reports_shared_entries_of_output_masks():
    layer = keras.layers.MultiHeadAttention(2, 2, name="mha")
    layer(tf.zeros((1, 3, 4)), tf.zeros((1, 3, 4)))
    variables = layer.trainable_weights
    entries = declared_lib.resolve_masks(
        [(layer, maskfit.OutputMask([1, 0, 1, 1]))], variables
    )
    query = entries[variables.index(layer.query_dense.kernel)]
    assert query.kind == "output" and bool(np.all(query.shared))


def test_element_mask_of_zeros_and_ones_is_kept_as_bool():
    a = _dense()
    ones = declared_lib.resolve_declared(
        [(a, maskfit.ElementMask({"kernel": np.eye(2, 3)}))], a.trainable_weights
    )
    (mask,) = ones.values()
    assert mask_state.state_dtype(mask, tf.float32) == tf.bool
    half = mask._replace(table=mask.table * 0.5)
    assert mask_state.state_dtype(half, tf.float32) == tf.float32


def test_mask_state_selects_the_interval_in_a_traced_function():
    a = _dense()
    (mask,) = declared_lib.resolve_declared(
        [
            (
                a,
                maskfit.PiecewiseMask(
                    [2, 4],
                    [maskfit.OutputMask(v) for v in ([0, 0, 0], [1, 0, 0], [1, 1, 1])],
                ),
            )
        ],
        a.trainable_weights,
    ).values()
    state = mask_state.MaskState(mask, tf.float32)
    state.assign(mask, 0)
    select = tf.function(state.select)
    seen = []
    for step in range(6):
        select(tf.constant(step, tf.int64))
        seen.append(state.current.numpy().tolist())
    assert seen == [[0, 0, 0]] * 2 + [[1, 0, 0]] * 2 + [[1, 1, 1]] * 2


def test_mask_states_retrace_only_when_the_structure_changes():
    a, b = _dense(name="a"), _dense(name="b")
    variables = a.trainable_weights + b.trainable_weights
    states = mask_state.MaskStates()

    def sync(specs):
        found = declared_lib.resolve_declared(specs, variables)
        return states.sync(found, [], {}, variables, step=0, skip_frozen=True)

    assert sync([(a, maskfit.OutputMask([1, 0, 1]))])
    current = states.by_index[0].state.current
    assert not sync([(a, maskfit.OutputMask([0, 1, 1]))])  # new values, same state
    assert states.by_index[0].state.current is current
    np.testing.assert_array_equal(current.numpy(), [0, 1, 1])
    assert not sync([])  # removed: all ones, no retrace
    np.testing.assert_array_equal(current.numpy(), [1, 1, 1])
    assert sync(
        [(a, maskfit.OutputMask([1, 0, 1])), (b, maskfit.ElementMask({"bias": 0.5}))]
    )
    # An element mask that freezes its variable whole is never read in the step.
    assert sync(
        [(a, maskfit.OutputMask([1, 0, 1])), (b, maskfit.ElementMask({"bias": 0}))]
    )
    bias = states.by_index[3]
    assert bias.state is None
    assert states.needs[3].frozen == (True,)
