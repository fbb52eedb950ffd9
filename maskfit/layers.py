"""`Scale`: a learnable scale whose custom gradient is written per example."""

import keras

from maskfit import checks
from maskfit.gradients import custom_gradient


@custom_gradient
def _scale(x, scale):
    """Returns `x * scale` with a hand-written gradient.

    The gradients are the textbook per-example formulas, with the broadcast
    shape of `x * scale`: `maskfit.custom_gradient` sums `upstream * x` over
    the batch (and any axis where `scale` has size 1) and casts it to the
    variable's dtype, so nothing here needs to know `scale`'s shape.
    """

    def grad_fn(upstream):
        dx = upstream * scale  # d(x * scale)/dx, already x's shape.
        dscale = upstream * x  # (batch, ...): one term per example.
        return dx, dscale

    return x * scale, grad_fn


def _check_shape(shape):
    if shape is None:
        return None
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    if dims is None or not all(checks.is_integer(d) and d > 0 for d in dims):
        raise ValueError(
            "Received an invalid value for `shape`, expected None (one scale per "
            "feature), () (one scalar) or a tuple of positive integers that "
            f"broadcasts to the input. Received: shape={shape!r}"
        )
    return dims


@keras.saving.register_keras_serializable(package="maskfit")
class Scale(keras.layers.Layer):
    """Multiplies its input by a learnable `scale` weight.

    The gradient is written with `maskfit.custom_gradient`, and is a worked
    example of it: see `_scale` in this module. It runs on TensorFlow and
    JAX alike, and a model saved with the layer loads and trains on either
    backend.

    Args:
      shape: Shape of `scale`. `None` (default) gives one scale per feature,
        `(input_shape[-1],)`; `()` gives a single scalar; any other tuple must
        broadcast to the input without changing its shape (each axis 1 or the
        input's size, aligned from the right).
      initializer: Initializer for `scale`, default "ones".
      constraint: Optional constraint for `scale`.
      regularizer: Optional regularizer for `scale`.
      **kwargs: Base `keras.layers.Layer` arguments, e.g. `name`, `dtype`.

    Example:
      >>> layer = Scale(shape=(), initializer=keras.initializers.Constant(2.0))
      >>> layer(np.ones((2, 3), "float32")).numpy()
      array([[2., 2., 2.],
             [2., 2., 2.]], dtype=float32)
    """

    def __init__(
        self,
        shape=None,
        initializer="ones",
        constraint=None,
        regularizer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.scale_shape = _check_shape(shape)
        self.initializer = keras.initializers.get(initializer)
        self.constraint = keras.constraints.get(constraint)
        self.regularizer = keras.regularizers.get(regularizer)

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        shape = self.scale_shape
        if shape is None:
            if not input_shape or input_shape[-1] is None:
                raise ValueError(
                    f"Layer '{self.name}' needs a known last input axis for one scale "
                    f"per feature. Received: input_shape={input_shape}. Pass "
                    "`shape=()` for a single scale."
                )
            shape = (input_shape[-1],)
        fits = len(shape) <= len(input_shape) and all(
            d == 1 or d == n for d, n in zip(shape[::-1], input_shape[::-1])
        )
        if not fits:
            raise ValueError(
                f"Layer '{self.name}' has `shape={shape}`, which does not broadcast "
                f"to its input of shape {input_shape} without changing it: each "
                "axis of `shape`, aligned from the right, must be 1 or the input's "
                f"(known) size. Received: input_shape={input_shape}"
            )
        self.scale = self.add_weight(
            name="scale",
            shape=shape,
            initializer=self.initializer,
            constraint=self.constraint,
            regularizer=self.regularizer,
            trainable=True,
        )

    def call(self, inputs):
        # The variable goes in as an argument; custom_gradient reads it into a
        # tensor first (so TensorFlow's eager mode does not count its gradient
        # twice, and JAX differentiates it as an input).
        return _scale(inputs, self.scale)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "shape": None if self.scale_shape is None else list(self.scale_shape),
                "initializer": keras.initializers.serialize(self.initializer),
                "constraint": keras.constraints.serialize(self.constraint),
                "regularizer": keras.regularizers.serialize(self.regularizer),
            }
        )
        return config
