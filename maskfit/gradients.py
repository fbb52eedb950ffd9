"""A custom gradient that sums each gradient to the shape of its input.

On TensorFlow a `tf.custom_gradient`; on JAX a `jax.custom_gradient` (static shapes).
"""

import functools
import inspect
import operator

import keras
import numpy as np
import tensorflow as tf

from maskfit import support


def _shape_str(shape):
    """Formats a shape as `(None, 3)`; a list may also hold names like "batch"."""
    if not isinstance(shape, list):
        shape = tf.TensorShape(shape)
        if shape.rank is None:
            return "<unknown rank>"
        shape = shape.as_list()
    trailing_comma = "," if len(shape) == 1 else ""
    return "(" + ", ".join(map(str, shape)) + trailing_comma + ")"


def reduction_axes(grad_shape, shape, name="input"):
    """Returns the axes to sum so a gradient of `grad_shape` gets `shape`.

    The rule is PyTorch's `sum_to`: the gradient must be a broadcast of the
    input. Its extra leading axes are summed away, and axes where the input has
    size 1 but the gradient does not are summed with `keepdims=True`. An axis
    whose size is unknown (`None`) on both sides is reported in neither list.

    Args:
      grad_shape: The gradient's shape; a `tf.TensorShape`, list or tuple.
      shape: The input's shape, same types. Both ranks must be known.
      name: How the error message names the input, e.g. "argument 'x'".

    Returns:
      A pair `(leading_axes, stretched_axes)` of tuples of gradient axes.

    Raises:
      ValueError: If the gradient is not a broadcast of the input, naming the
        input, both shapes and the axes that conflict.

    Example:
      >>> reduction_axes((32, 4, 3), (1, 3))
      ((0,), (1,))
    """
    grad_dims = tf.TensorShape(grad_shape).as_list()
    dims = tf.TensorShape(shape).as_list()
    leading = len(grad_dims) - len(dims)
    if leading < 0:
        raise ValueError(
            f"The gradient for {name} has shape {_shape_str(grad_dims)} but "
            f"{name} has shape {_shape_str(dims)}: a gradient needs at least the "
            f"input's rank {len(dims)}, got rank {len(grad_dims)}. Return a "
            f"gradient of shape {_shape_str(dims)}."
        )
    stretched, conflicts = [], []
    for axis, (g, d) in enumerate(zip(grad_dims[leading:], dims), leading):
        if d == 1 and g != 1:
            stretched.append(axis)
        elif g is not None and d is not None and g != d:
            conflicts.append(
                f"axis {axis} has size {g} in the gradient but {d} in the input"
            )
    if conflicts:
        raise ValueError(
            f"The gradient for {name} has shape {_shape_str(grad_dims)}, but "
            f"{name} has shape {_shape_str(dims)} and the gradient cannot be "
            f"summed to it: {'; '.join(conflicts)}. Only extra leading axes, and "
            f"axes where the input has size 1, are summed away; return a gradient "
            f"of shape {_shape_str(dims)} or a broadcast of it such as "
            f"{_shape_str(['batch'] + dims)}."
        )
    return tuple(range(leading)), tuple(stretched)


def _reduce(grad, static_shape, dynamic_shape, dtype, name):
    """Sums `grad` to `static_shape`, then casts it to `dtype`."""
    if grad is None or isinstance(grad, tf.IndexedSlices):
        return grad
    grad = tf.convert_to_tensor(grad)
    dtype = tf.as_dtype(dtype) if dtype is not None else grad.dtype
    if not (dtype.is_floating or dtype.is_complex):
        return grad  # TensorFlow drops gradients of integer inputs anyway.
    # Sum in the wider of the two float types: float16 sums overflow easily.
    if grad.dtype.is_floating and dtype.is_floating and dtype.size > grad.dtype.size:
        grad = tf.cast(grad, dtype)
    static_shape = tf.TensorShape(static_shape)
    if grad.shape.rank is not None and static_shape.rank is not None:
        leading, stretched = reduction_axes(grad.shape, static_shape, name)
        unknown = [
            i
            for i, (g, d) in enumerate(zip(grad.shape[len(leading) :], static_shape))
            if g is None and d is None
        ]
    else:
        leading, stretched, unknown = (), (), [None]
    if unknown:
        # Some axis is unknown on both sides: let TensorFlow's own broadcasting
        # gradient helper pick the axes at run time.
        if dynamic_shape is None:
            raise ValueError(
                f"Cannot tell which axes of the gradient for {name} to sum: the "
                f"gradient has shape {_shape_str(grad.shape)} and {name} has shape "
                f"{_shape_str(static_shape)}. Pass the input's dynamic shape, "
                f"`tf.shape(x)`, instead."
            )
        target = tf.cast(dynamic_shape, tf.int32)
        _, axes = tf.raw_ops.BroadcastGradientArgs(
            s0=tf.shape(grad, out_type=tf.int32), s1=target
        )
        grad = tf.reshape(tf.reduce_sum(grad, axis=axes), target)
    else:
        if leading:
            grad = tf.reduce_sum(grad, axis=leading)
        if stretched:
            grad = tf.reduce_sum(
                grad, axis=[a - len(leading) for a in stretched], keepdims=True
            )
    return tf.cast(grad, dtype) if grad.dtype != dtype else grad


def reduce_to_shape(grad, shape, name="input"):
    """Sums a gradient over the axes that broadcasting added or stretched.

    See `reduction_axes` for the rule. Static shapes are used when they decide
    the axes; an axis unknown in both shapes (a `None` batch axis in a
    `tf.function`) needs `shape` as a tensor, e.g. `tf.shape(x)`, and is then
    reduced with `tf.raw_ops.BroadcastGradientArgs` at run time.

    Args:
      grad: The gradient, a tensor, `tf.IndexedSlices` (returned unchanged) or
        `None` (returned unchanged).
      shape: The input's shape: a `tf.TensorShape`, list, tuple, or a 1-D
        integer tensor.
      name: How error messages name the input, e.g. "argument 'x'".

    Returns:
      `grad` summed to `shape`, in its own dtype.

    Raises:
      ValueError: If `grad` is not a broadcast of `shape` (see
        `reduction_axes`).

    Under JAX, `grad` is a JAX array and `shape` a static shape (a tuple,
    or a concrete 1-D integer array).

    Example:
      >>> g = keras.ops.ones((32, 1))
      >>> keras.ops.convert_to_numpy(reduce_to_shape(g, (1,)))
      array([32.], dtype=float32)
    """
    support.require("custom_gradient", "reduce_to_shape")
    if _on_jax():
        return _reduce_static(grad, _static_shape(shape, name), None, name)
    if tf.is_tensor(shape):
        static = tf.get_static_value(shape)
        static_shape = (
            tf.TensorShape(static.tolist())
            if static is not None
            else (
                tf.TensorShape([None] * shape.shape[0])
                if shape.shape.rank == 1 and shape.shape[0] is not None
                else tf.TensorShape(None)
            )
        )
        return _reduce(grad, static_shape, shape, None, name)
    return _reduce(grad, shape, None, None, name)


def _on_jax():
    return keras.backend.backend() == "jax"


def _static_shape(shape, name):
    """`shape` as a tuple of ints (JAX's shapes are static)."""
    try:
        if isinstance(shape, tf.TensorShape):
            shape = shape.as_list()
        elif not isinstance(shape, (tuple, list)):
            shape = np.asarray(shape).tolist()  # a concrete 1-D array
        return tuple(operator.index(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(
            f"reduce_to_shape needs the static shape of {name} under JAX, where"
            f" every shape is known: pass `x.shape`. Received: shape={shape!r}"
        ) from None


def _reduce_static(grad, shape, dtype, name):
    """`_reduce` in `keras.ops`, for a static `shape` (JAX)."""
    if grad is None:
        return None
    grad = keras.ops.convert_to_tensor(grad)
    own = keras.backend.standardize_dtype(grad.dtype)
    dtype = own if dtype is None else keras.backend.standardize_dtype(dtype)
    if not dtype.startswith(("float", "bfloat", "complex")):
        return None  # an integer input gets no gradient (a zero one under JAX)
    if own.startswith("float") and dtype.startswith("float"):
        if np.dtype(dtype).itemsize > np.dtype(own).itemsize:
            grad = keras.ops.cast(grad, dtype)  # summed in the wider type
    leading, stretched = reduction_axes(grad.shape, shape, name)
    if leading:
        grad = keras.ops.sum(grad, axis=leading)
    if stretched:
        axes = [a - len(leading) for a in stretched]
        grad = keras.ops.sum(grad, axis=axes, keepdims=True)
    return keras.ops.cast(grad, dtype)


def _to_tensor(value):
    """Reads variables so the custom gradient sees them as plain inputs."""
    if isinstance(value, keras.Variable) and _on_jax():
        return value.value  # in a stateless scope, the value it maps to
    if isinstance(value, (keras.Variable, tf.Variable)):
        # Else watched as a captured variable in eager mode: counted twice.
        return tf.convert_to_tensor(value)
    return value


def _reduce_like(grad, value, name):
    """Sums `grad` to the shape of `value` and casts it to its dtype."""
    if not isinstance(value, tf.Variable):
        value = tf.convert_to_tensor(value)
    dynamic = None if value.shape.is_fully_defined() else tf.shape(value)
    return _reduce(grad, value.shape, dynamic, value.dtype, name)


def _accepts_variables(fn):
    params = inspect.signature(fn).parameters
    return "variables" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def custom_gradient(f):
    """Decorates `f` like `tf.custom_gradient`, then fixes gradient shapes.

    `f(*args)` returns `(y, grad_fn)`. `grad_fn(*upstream)` returns one gradient
    per positional argument, or, when `f` reads variables it was not given,
    `grad_fn(*upstream, variables=...)` returns `(input_grads, variable_grads)`
    with one gradient per entry of `variables`, in that list's order (compare
    entries by identity: their order differs between eager and graph mode).

    Every gradient is then summed to its input's shape, so a per-example
    gradient such as `upstream * x` of shape `(batch, 1)` for a scale of shape
    `(1,)` becomes the `(1,)` total the optimizer expects; gradients that are
    not a broadcast of their input raise a `ValueError` naming the argument or
    variable. Each gradient is cast to its input's dtype, and `None` passes
    through. `keras.Variable` and `tf.Variable` arguments are read into tensors
    first, so they are counted once in eager mode too. Keyword-only arguments
    of `f` are passed through and get no gradient.

    Args:
      f: The forward function, as for `tf.custom_gradient`.

    Returns:
      A function with `f`'s signature whose gradient is `grad_fn`'s, reduced.
      Calling it under a Keras backend other than TensorFlow raises a
      `NotImplementedError` (`maskfit.support`).

    Example:
      >>> @custom_gradient
      ... def scale(x, s):
      ...   def grad_fn(upstream):
      ...     return upstream * s, upstream * x   # (batch, 1), not (1,)
      ...   return x * s, grad_fn
      >>> s = tf.Variable([2.0])
      >>> with tf.GradientTape() as tape:
      ...   y = scale(tf.fill((4, 1), 2.0), s)
      >>> tape.gradient(y, s).numpy()
      array([8.], dtype=float32)
    """
    signature = inspect.signature(f)
    fn_name = getattr(f, "__name__", "custom_gradient function")

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        # Refused when called, not when decorating: modules decorate at import.
        support.require("custom_gradient", f"the function {fn_name}")
        bound = signature.bind(*args, **kwargs)
        names = []
        for param in signature.parameters.values():
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                names += [
                    f"argument {len(names) + j} (in *{param.name})"
                    for j in range(len(bound.arguments.get(param.name, ())))
                ]
            elif param.kind in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                names.append(f"argument '{param.name}'")
        inputs = tf.nest.map_structure(_to_tensor, bound.args)
        flat_names = []
        for arg, name in zip(inputs, names):
            n = len(tf.nest.flatten(arg))
            flat_names += [name] if n == 1 else [f"{name} (leaf {k})" for k in range(n)]
        static_kwargs = bound.kwargs

        def fix(grads, values, labels):
            flat = tf.nest.flatten(grads)
            if len(flat) != len(values):
                return grads  # tf.custom_gradient reports the count mismatch.
            return [
                _reduce_like(g, v, f"{label} of {fn_name}")
                for g, v, label in zip(flat, values, labels)
            ]

        def forward(*tensors):
            y, grad_fn = f(*tensors, **static_kwargs)
            flat_tensors = tf.nest.flatten(tensors)

            def backward(*upstream):
                return fix(grad_fn(*upstream), flat_tensors, flat_names)

            def backward_with_variables(*upstream, variables=None):
                if not variables:
                    return backward(*upstream)
                input_grads, var_grads = grad_fn(*upstream, variables=variables)
                var_labels = [f"variable '{v.name}'" for v in variables]
                return (
                    fix(input_grads, flat_tensors, flat_names),
                    fix(var_grads, variables, var_labels),
                )

            # Keep tf.custom_gradient's own check that grad_fn accepts `variables`.
            if _accepts_variables(grad_fn):
                return y, backward_with_variables
            return y, backward

        forward.__name__ = fn_name
        if _on_jax():
            return _call_jax(f, fn_name, inputs, flat_names, static_kwargs)
        return tf.custom_gradient(forward)(*inputs)

    return wrapper


def _call_jax(f, fn_name, inputs, flat_names, static_kwargs):
    """`custom_gradient`'s call on JAX: a `jax.custom_gradient` over the leaves."""
    import jax  # only under KERAS_BACKEND=jax

    leaves = tf.nest.flatten(inputs)

    def forward(*leaves):
        y, grad_fn = f(*tf.nest.pack_sequence_as(inputs, leaves), **static_kwargs)
        _check_no_variables(grad_fn, fn_name)

        def rule(upstream):
            grads = tf.nest.flatten(grad_fn(*tf.nest.flatten(upstream)))
            if len(grads) != len(leaves):
                raise ValueError(
                    f"The gradient function of {fn_name} returned {len(grads)}"
                    f" gradients for its {len(leaves)} inputs"
                    f" ({', '.join(flat_names)}). Return one per input (None for"
                    " an input without one)."
                )
            return tuple(
                _reduce_static(g, tuple(x.shape), x.dtype, f"{label} of {fn_name}")
                for g, x, label in zip(grads, leaves, flat_names)
            )

        return y, rule

    try:
        return jax.custom_gradient(forward)(*leaves)
    except Exception as error:
        # JAX 0.5+ raises UnexpectedTracerError; 0.4 a CustomVJPException.
        closed_over = isinstance(error, jax.errors.UnexpectedTracerError) or (
            type(error).__name__ == "CustomVJPException"
        )
        if not closed_over:
            raise
        raise ValueError(
            f"{fn_name} reads a value that JAX differentiates without being given"
            " it (most likely a variable it reads itself, such as a layer's"
            " weight inside `fit`); a custom gradient on JAX sees only its"
            " arguments. Pass every variable it reads as an argument, e.g."
            f" `{fn_name}(x, self.kernel)`. JAX said: {error}"
        ) from error


def _check_no_variables(grad_fn, fn_name):
    """Raises when `grad_fn` needs `variables=`, which JAX cannot give it."""
    params = inspect.signature(grad_fn).parameters
    wanted = params.get("variables")
    if wanted is not None and wanted.default is inspect.Parameter.empty:
        raise TypeError(
            f"The gradient function of {fn_name} requires `variables`, the"
            " variables the function reads without being given them, which"
            " only TensorFlow records. Under JAX pass every variable it reads"
            " as an argument (its gradient is then one of grad_fn's results),"
            " or give `variables` a default of None."
        )
