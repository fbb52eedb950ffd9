"""Tests for maskfit.gradients."""

import hypothesis
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

from maskfit.gradients import custom_gradient, reduce_to_shape, reduction_axes

MODES = ["eager", "graph", "jit"]


def run(fn, mode):
    """Runs `fn()` eagerly, in a tf.function, or XLA-compiled."""
    if mode == "eager":
        return fn()
    return tf.function(fn, jit_compile=(mode == "jit"))()


@custom_gradient
def scaler(x, s):
    """The seed's function: its s-gradient has x's (batch, 1) shape."""

    def grad_fn(upstream):
        return upstream * s, upstream * x

    return x * s, grad_fn


def grad_of(fn, *args, target):
    """Returns d sum(fn(*args)) / d target; tensor arguments are watched."""
    with tf.GradientTape() as tape:
        for arg in args:
            if not isinstance(arg, (tf.Variable, keras.Variable)):
                tape.watch(arg)
        loss = tf.reduce_sum(fn(*args))
    return tape.gradient(loss, target)


# Reduction rule.


@pytest.mark.parametrize(
    "grad_shape, shape, axes, keep",
    [
        ((5, 3), (3,), (0,), False),  # leading batch axis
        ((2, 5, 3), (3,), (0, 1), False),  # two leading axes
        ((5, 3), (1, 3), (0,), True),  # size-1 axis stretched
        ((5, 3), (5, 1), (1,), True),  # trailing size-1 axis
        ((5, 3), (), (0, 1), False),  # scalar
        ((2, 5, 3), (1, 1), (0, 1, 2), None),  # leading + stretched combo
        ((5, 3), (5, 3), (), False),  # already right
    ],
)
def test_reduce_to_shape_matches_hand_sum(grad_shape, shape, axes, keep):
    grad = tf.random.stateless_normal(grad_shape, seed=(1, 2))
    if keep is None:  # Combo: drop axis 0, keep axes 1 and 2.
        want = tf.reduce_sum(tf.reduce_sum(grad, 0), (0, 1), keepdims=True)
    else:
        want = tf.reduce_sum(grad, axes, keepdims=keep)
    got = reduce_to_shape(grad, shape)
    assert tuple(got.shape) == shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_reduction_axes_reports_leading_and_stretched():
    assert reduction_axes((32, 4, 3), (1, 3)) == ((0,), (1,))
    assert reduction_axes((4, 3), (4, 3)) == ((), ())


@st.composite
def broadcast_pairs(draw):
    """An input shape and a gradient shape that broadcasting it could give."""
    shape = draw(st.lists(st.integers(1, 3), max_size=3))
    leading = draw(st.lists(st.integers(1, 3), max_size=2))
    stretched = [draw(st.integers(1, 3)) if d == 1 else d for d in shape]
    return tuple(shape), tuple(leading + stretched)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(broadcast_pairs(), st.integers(0, 2**31 - 1))
def test_reduce_to_shape_property(pair, seed):
    shape, grad_shape = pair
    grad = np.random.default_rng(seed).normal(size=grad_shape).astype("float32")
    want = grad.sum(axis=tuple(range(len(grad_shape) - len(shape))))
    stretched = tuple(
        i for i, (g, d) in enumerate(zip(want.shape, shape)) if d == 1 and g != 1
    )
    want = want.sum(axis=stretched, keepdims=True)
    got = reduce_to_shape(tf.constant(grad), shape)
    assert tuple(got.shape) == shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(st.lists(st.integers(2, 4), min_size=1, max_size=3), st.data())
def test_reduce_to_shape_rejects_conflicts_property(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    grad_shape = list(shape)
    grad_shape[axis] += 1
    with pytest.raises(ValueError, match=f"axis {axis} has size"):
        reduction_axes(grad_shape, shape)


def test_unknown_dims_on_both_sides_use_dynamic_shapes():
    @custom_gradient
    def add(x, b):
        def grad_fn(upstream):
            return upstream, upstream  # b's gradient has x's shape (batch, 3).

        return x + b, grad_fn

    spec = tf.TensorSpec((None, 3))
    bias_spec = tf.TensorSpec((None, 1))

    @tf.function(input_signature=[spec, bias_spec])
    def grad_b(x, b):
        with tf.GradientTape() as tape:
            tape.watch(b)
            loss = tf.reduce_sum(add(x, b) * [[1.0, 2.0, 3.0]])
        return tape.gradient(loss, b)

    got = grad_b(tf.ones((4, 3)), tf.zeros((4, 1)))
    np.testing.assert_allclose(got, np.full((4, 1), 6.0))


def test_reduce_to_shape_needs_dynamic_shape_when_undecidable():
    @tf.function(input_signature=[tf.TensorSpec((None, 3))])
    def reduce(grad):
        return reduce_to_shape(grad, [None, 3])

    with pytest.raises(ValueError, match=r"tf\.shape\(x\)"):
        reduce(tf.ones((2, 3)))


def test_reduce_to_shape_accepts_a_shape_tensor():
    @tf.function(input_signature=[tf.TensorSpec((None, 3)), tf.TensorSpec((None, 1))])
    def reduce(grad, like):
        return reduce_to_shape(grad, tf.shape(like))

    got = reduce(tf.ones((2, 3)), tf.ones((2, 1)))
    np.testing.assert_array_equal(got, np.full((2, 1), 3.0))


# Errors.


def test_irreducible_gradient_names_argument_and_shapes():
    @custom_gradient
    def bad(x, s):
        def grad_fn(upstream):
            return upstream * s, tf.ones((4, 3))

        return x * s, grad_fn

    s = tf.Variable([1.0, 1.0])
    with pytest.raises(ValueError) as err:
        grad_of(bad, tf.ones((4, 1)), s, target=s)
    message = str(err.value)
    assert "argument 's' of bad" in message
    assert "(4, 3)" in message and "(2,)" in message
    assert "axis 1 has size 3 in the gradient but 2" in message


def test_too_low_rank_gradient_is_an_error():
    with pytest.raises(ValueError, match=r"has shape \(3,\).*rank 2"):
        reduce_to_shape(tf.ones((3,)), (1, 3), name="argument 'w'")


def test_varargs_are_named_by_position():
    @custom_gradient
    def prod(*xs):
        def grad_fn(upstream):
            return upstream, tf.ones((5, 5))

        return xs[0] * xs[1], grad_fn

    b = tf.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match=r"argument 1 \(in \*xs\)"):
        grad_of(prod, tf.ones((3, 2)), b, target=b)


def test_captured_variable_is_named_in_error():
    w = tf.Variable([1.0, 2.0], name="my_weight")

    @custom_gradient
    def f(x):
        def grad_fn(upstream, variables=None):
            return upstream * w, [tf.ones((3, 4)) for _ in variables]

        return x * w, grad_fn

    with pytest.raises(ValueError, match="variable 'my_weight"):
        grad_of(f, tf.ones((3, 2)), target=w)


def test_grad_fn_must_accept_variables_when_it_captures_one():
    w = tf.Variable(2.0)

    @custom_gradient
    def f(x):
        return x * w, lambda upstream: upstream * w

    with pytest.raises(TypeError, match="variables"):
        f(tf.ones(()))


# Variables.


@pytest.mark.parametrize("mode", MODES)
def test_keras_variable_argument_is_counted_once(mode):
    s = keras.Variable([3.0])
    x = tf.fill((2, 1), 2.0)
    # d/ds sum(x * s) = sum(x) = 4; plain tf.custom_gradient gives 8 eagerly.
    got = run(lambda: grad_of(scaler, x, s, target=s), mode)
    np.testing.assert_array_equal(got, [4.0])


@pytest.mark.parametrize("mode", MODES)
def test_tf_variable_argument(mode):
    s = tf.Variable([[3.0, 1.0]])
    x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    got = run(lambda: grad_of(scaler, x, s, target=s), mode)
    np.testing.assert_array_equal(got, [[9.0, 12.0]])


@pytest.mark.parametrize("mode", MODES)
def test_captured_variables_are_reduced_and_mapped_by_identity(mode):
    a = keras.Variable([[1.0, 2.0]], name="z_first")  # Sorts last by name.
    b = keras.Variable(3.0, name="a_second")
    x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])

    @custom_gradient
    def affine(x):
        def grad_fn(upstream, variables=None):
            grads = {id(a.value): upstream * x, id(b.value): upstream}
            return upstream * a * b, [grads[id(v)] for v in variables]

        return x * a * b, grad_fn

    got_a, got_b, got_x = run(lambda: grad_of(affine, x, target=[a, b, x]), mode)
    np.testing.assert_allclose(got_a, [[9.0, 12.0]])  # summed over batch
    np.testing.assert_allclose(got_b, 6.0)  # summed to a scalar
    np.testing.assert_allclose(got_x, np.full((3, 2), [3.0, 6.0]))


@pytest.mark.parametrize("mode", MODES)
def test_none_gradients_pass_through(mode):
    @custom_gradient
    def f(x, s):
        return x * s, lambda upstream: (upstream * s, None)

    s = tf.Variable([1.0])
    got = run(lambda: grad_of(f, tf.ones((3, 1)), s, target=[s])[0], mode)
    assert got is None


# Dtypes.


@pytest.mark.parametrize("mode", MODES)
def test_gradients_are_cast_to_input_dtype(mode):
    @custom_gradient
    def f(x, s):
        def grad_fn(upstream):
            wrong = tf.float32 if x.dtype == tf.float16 else tf.float16
            return tf.cast(upstream * s, wrong), tf.cast(upstream * x, wrong)

        return x * s, grad_fn

    x16 = tf.ones((4, 1), tf.float16)
    s32 = tf.Variable([1.0])

    def grads():
        with tf.GradientTape() as tape:
            tape.watch(x16)
            loss = tf.reduce_sum(f(x16, tf.cast(s32, tf.float16)))
        return tape.gradient(loss, [x16, s32])

    gx, gs = run(grads, mode)
    assert gx.dtype == tf.float16 and gs.dtype == tf.float32
    np.testing.assert_array_equal(gs, [4.0])


def test_float16_gradient_is_summed_in_float32():
    grad = tf.fill((4096, 1), tf.constant(30.0, tf.float16))  # sum > fp16 max
    got = reduce_to_shape(tf.cast(grad, tf.float32), (1,))
    np.testing.assert_array_equal(got, [4096 * 30.0])
    s = tf.Variable([1.0])

    @custom_gradient
    def f(x):
        return x * s, lambda up, variables=None: (up, [grad for _ in variables])

    np.testing.assert_array_equal(
        grad_of(f, tf.ones((4096, 1)), target=s), [4096 * 30.0]
    )
