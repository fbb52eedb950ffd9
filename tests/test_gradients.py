"""Tests for maskfit.gradients, on TensorFlow and (where marked) JAX.

The gradient checks go through `grads`, which takes them with a
`tf.GradientTape` on TensorFlow and `jax.grad` on JAX; `run` runs a check
eagerly or compiled (`tf.function`, with or without XLA; `jax.jit`).
"""

import hypothesis
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

import maskfit
from maskfit.gradients import custom_gradient, reduce_to_shape, reduction_axes

BACKEND = keras.backend.backend()
MODES = ["eager", "graph", "jit"] if BACKEND == "tensorflow" else ["eager", "jit"]
BOTH = pytest.mark.backends("tensorflow", "jax")


def run(fn, mode):
    """Runs `fn()` eagerly, in a tf.function, or XLA-compiled (`jax.jit` on JAX)."""
    if mode == "eager":
        return fn()
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)()
    return tf.function(fn, jit_compile=(mode == "jit"))()


def grads(fn, args, wrt):
    """d sum(fn(*args)) / d args[i] for each i in `wrt`, on either backend."""
    if BACKEND == "jax":
        import jax

        def loss(*values):
            return keras.ops.sum(fn(*values))

        return list(jax.grad(loss, argnums=tuple(wrt))(*args))
    args = [tf.convert_to_tensor(a) for a in args]
    with tf.GradientTape() as tape:
        for arg in args:
            tape.watch(arg)
        loss = tf.reduce_sum(fn(*args))
    return tape.gradient(loss, [args[i] for i in wrt])


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
@BOTH
def test_reduce_to_shape_matches_hand_sum(grad_shape, shape, axes, keep):
    grad = np.random.default_rng(2).normal(size=grad_shape).astype("float32")
    if keep is None:  # Combo: drop axis 0, keep axes 1 and 2.
        want = grad.sum(0).sum((0, 1), keepdims=True)
    else:
        want = grad.sum(axes, keepdims=keep)
    got = reduce_to_shape(keras.ops.convert_to_tensor(grad), shape)
    assert tuple(got.shape) == shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@BOTH
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


@BOTH
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
    got = reduce_to_shape(keras.ops.convert_to_tensor(grad), shape)
    assert tuple(got.shape) == shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@BOTH
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


@BOTH
@pytest.mark.parametrize("mode", MODES)
def test_irreducible_gradient_names_argument_and_shapes(mode):
    @custom_gradient
    def bad(x, s):
        def grad_fn(upstream):
            return upstream * s, keras.ops.ones((4, 3))

        return x * s, grad_fn

    args = (np.ones((4, 1), "float32"), np.ones(2, "float32"))
    with pytest.raises(ValueError) as err:
        run(lambda: grads(bad, args, wrt=[1]), mode)
    message = str(err.value)
    assert "argument 's' of bad" in message
    assert "(4, 3)" in message and "(2,)" in message
    assert "axis 1 has size 3 in the gradient but 2" in message


@BOTH
def test_too_low_rank_gradient_is_an_error():
    with pytest.raises(ValueError, match=r"has shape \(3,\).*rank 2"):
        reduce_to_shape(keras.ops.ones((3,)), (1, 3), name="argument 'w'")


@BOTH
def test_varargs_are_named_by_position():
    @custom_gradient
    def prod(*xs):
        def grad_fn(upstream):
            return upstream, keras.ops.ones((5, 5))

        return xs[0] * xs[1], grad_fn

    args = (np.ones((3, 2), "float32"), np.array([1.0, 2.0], "float32"))
    with pytest.raises(ValueError, match=r"argument 1 \(in \*xs\)"):
        grads(prod, args, wrt=[1])


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


@BOTH
@pytest.mark.parametrize("mode", MODES)
def test_none_gradients_pass_through(mode):
    @custom_gradient
    def f(x, s):
        return x * s, lambda upstream: (upstream * s, None)

    args = (np.ones((3, 1), "float32"), np.ones(1, "float32"))
    (got,) = run(lambda: grads(f, args, wrt=[1]), mode)
    if BACKEND == "tensorflow":
        assert got is None
    else:  # JAX has no None gradient: it is zero
        np.testing.assert_array_equal(got, [0.0])


@BOTH
@pytest.mark.parametrize("mode", MODES)
def test_gradients_are_cast_to_input_dtype(mode):
    @custom_gradient
    def f(x, s):
        def grad_fn(upstream):
            wrong = "float32" if x.dtype == "float16" else "float16"
            return (
                keras.ops.cast(upstream * s, wrong),
                keras.ops.cast(upstream * x, wrong),
            )

        return x * s, grad_fn

    def cast_in(x, s):
        return f(x, keras.ops.cast(s, "float16"))

    args = (np.ones((4, 1), "float16"), np.ones(1, "float32"))
    gx, gs = run(lambda: grads(cast_in, args, wrt=[0, 1]), mode)
    assert keras.backend.standardize_dtype(gx.dtype) == "float16"
    assert keras.backend.standardize_dtype(gs.dtype) == "float32"
    np.testing.assert_array_equal(gs, [4.0])


@BOTH
def test_a_float16_gradient_of_a_float32_input_is_summed_in_float32():
    @custom_gradient
    def f(x, s):
        def grad_fn(upstream):
            return upstream * s, keras.ops.full((4096, 1), 30.0, "float16")

        return x * s, grad_fn

    args = (np.ones((4096, 1), "float32"), np.ones(1, "float32"))
    (gs,) = grads(f, args, wrt=[1])  # 122880 overflows float16 (max 65504)
    np.testing.assert_array_equal(gs, [4096 * 30.0])


class SeedLayer(keras.layers.Layer):
    """The seed's layer, with `maskfit.custom_gradient` in place of TensorFlow's."""

    def build(self, input_shape):
        self.scale = self.add_weight(
            name="scale",
            shape=(1,),
            initializer=keras.initializers.Constant(2.0),
            trainable=True,
        )

    def call(self, inputs):
        return scaler(inputs, self.scale)


@BOTH
@pytest.mark.parametrize("mode", MODES)
def test_the_seed_layer_learns_its_scale_in_fit(mode):
    """The seed: a (1,) scale whose hand-written gradient has the batch's shape."""
    compiled = {"eager": dict(run_eagerly=True), "graph": {}}.get(
        mode, dict(jit_compile=True)
    )
    inputs = keras.Input((1,))
    layer = SeedLayer()
    model = maskfit.MaskedModel(inputs, layer(inputs))
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.05), **compiled)
    x = np.full((64, 1), 2.0, "float32")
    model.fit(x, x * 2.5, batch_size=16, epochs=5, verbose=0)
    assert tuple(layer.scale.shape) == (1,)
    np.testing.assert_allclose(layer.scale.numpy(), [2.5], atol=1e-3)


@pytest.mark.backends("jax")
@pytest.mark.parametrize("mode", MODES)
def test_a_keras_variable_argument_is_differentiated_as_fit_does_on_jax(mode):
    # Keras's JAX trainer maps each variable to a traced value in a
    # StatelessScope; an argument that is the variable reads that value.
    import jax

    s = keras.Variable([3.0])
    x = np.full((2, 1), 2.0, "float32")

    def loss(value):
        with keras.StatelessScope(state_mapping=[(s, value)]):
            return keras.ops.sum(scaler(x, s))

    got = run(lambda: jax.grad(loss)(keras.ops.convert_to_tensor([3.0])), mode)
    np.testing.assert_array_equal(got, [4.0])


@pytest.mark.backends("jax")
def test_a_variable_read_inside_is_refused_with_what_to_do_on_jax():
    import jax

    w = keras.Variable(3.0)

    @custom_gradient
    def reads_w(x):
        return x * w, lambda upstream: (upstream * w,)

    def loss(value):
        with keras.StatelessScope(state_mapping=[(w, value)]):
            return keras.ops.sum(reads_w(keras.ops.ones(2)))

    with pytest.raises(ValueError, match=r"reads_w reads a value .* as an argument"):
        jax.grad(loss)(keras.ops.convert_to_tensor(3.0))


@pytest.mark.backends("jax")
def test_a_gradient_function_that_needs_variables_is_refused_on_jax():
    @custom_gradient
    def f(x):
        def grad_fn(upstream, variables):
            return upstream, []

        return x * 2.0, grad_fn

    with pytest.raises(TypeError, match=r"requires `variables`.*as an argument"):
        grads(f, (np.ones(2, "float32"),), wrt=[0])


@pytest.mark.backends("jax")
def test_reduce_to_shape_needs_a_static_shape_on_jax():
    with pytest.raises(ValueError, match=r"static shape of input.*x\.shape"):
        reduce_to_shape(keras.ops.ones((2, 3)), [None, 3])


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
