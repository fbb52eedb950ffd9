"""How important a unit is: scores of a unit's entries, summed over its whole group.

An importance gives a score to every entry of a variable; a unit's score
is the sum over every entry that goes with it (its own weights, the input
slices of the layers that read it, its normalization scale; not biases nor
normalization offsets), as Torch-Pruning's group importances sum their
members. Scores run in TensorFlow ops, inside the training step.
"""

import keras
import tensorflow as tf

from maskfit.spec.config_value import ConfigValue

__all__ = ["Importance", "MagnitudeImportance", "TaylorImportance", "get_importance"]


class Importance(ConfigValue):
    """Base class: a score for every entry of a variable (higher is kept).

    A unit's score is the sum of the scores of the entries that go with it.
    Subclass it for a score of your own (or pass a function `(variable, value) -> scores`);
    set `needs_gradients` and implement `accumulate` for one that sums a
    quantity of each step's gradients, as `TaylorImportance` does.

    Example:

    >>> import keras, tensorflow as tf, maskfit.pruning as pruning
    >>> class L1(pruning.Importance):  # what MagnitudeImportance(p=1) computes
    ...     def __call__(self, variable, value, accumulated):
    ...         return tf.abs(value)
    >>> inputs = keras.Input((2,))
    >>> hidden = keras.layers.Dense(4, name="hidden")
    >>> model = keras.Model(inputs, keras.layers.Dense(1)(hidden(inputs)))
    >>> _ = hidden.kernel.assign([[1.0, 0.1, 2.0, 0.0], [1.0, 0.1, 2.0, 0.0]])
    >>> pruning.select_units(model, 0.5, importance=L1()).removed()
    {'hidden': {'units': [1, 3]}}
    """

    # Whether the training step must feed it gradients (`accumulate`).
    needs_gradients = False

    def __call__(self, variable, value, accumulated):
        """Returns a tensor of `value`'s shape: each entry's score.

        Args:
          variable: the model variable.
          value: its value in this step (removed entries are 0).
          accumulated: what `accumulate` summed since the last update, or None.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement __call__(variable, value,"
            " accumulated), or pass a function as `importance`."
        )

    def accumulate(self, value, gradient):
        """What one step adds to `accumulated` (for `needs_gradients`).

        Written in `keras.ops`: under JAX the compiled step calls it on JAX
        arrays (TensorFlow ops there fail when the step is traced).
        """
        raise NotImplementedError(
            f"{type(self).__name__} sets needs_gradients but does not implement"
            " accumulate(value, gradient)."
        )

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="maskfit")
class MagnitudeImportance(Importance):
    """`|w| ** p` per entry: `p=1` is the L1 norm of a unit's group, `p=2` its
    squared L2 norm (Torch-Pruning's `GroupMagnitudeImportance(p=2)`, the default).

    Args:
      p: 1 or 2 (any positive number works).

    Example:

    >>> import maskfit.pruning as pruning
    >>> pruning.MagnitudeImportance(p=1)
    MagnitudeImportance(p=1)
    """

    def __init__(self, p=2):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or p <= 0:
            raise ValueError(
                f"MagnitudeImportance p must be a positive number. Received: p={p!r}"
            )
        self.p = p

    def __call__(self, variable, value, accumulated):
        magnitude = tf.abs(value)
        if self.p == 1:
            return magnitude
        if self.p == 2:
            return tf.square(magnitude)
        return tf.pow(magnitude, self.p)

    def get_config(self):
        return {"p": self.p}


@keras.saving.register_keras_serializable(package="maskfit")
class TaylorImportance(Importance):
    """First-order Taylor: `|w * g|` per entry, summed over the steps since the last update.

    Molchanov et al. (2019); Torch-Pruning's `GroupTaylorImportance`. The
    training step adds `|w * g|` (g before masking; scaled by a loss scale
    under mixed precision) to a sum per variable, which restarts after each
    update. Before any step has run, the sum is 0 and every unit ties.

    Example:

    >>> import maskfit.pruning as pruning
    >>> pruning.TaylorImportance().needs_gradients
    True
    """

    needs_gradients = True

    def __call__(self, variable, value, accumulated):
        if accumulated is None:
            return tf.zeros_like(value)
        return accumulated

    def accumulate(self, value, gradient):
        # keras.ops: under JAX the compiled step sums it (maskfit.backend.jax_taylor).
        return keras.ops.abs(keras.ops.multiply(value, gradient))


class _Callable(Importance):
    """An importance from a function `(variable, value) -> scores`."""

    def __init__(self, function):
        self.function = function

    def __call__(self, variable, value, accumulated):
        return tf.convert_to_tensor(self.function(variable, value))

    def get_config(self):
        return {"function": keras.saving.serialize_keras_object(self.function)}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["function"]))


def get_importance(importance):
    """An `Importance` from one, a name ("l1", "l2", "taylor"), or a function.

    A function `(variable, value) -> scores` (TensorFlow ops, a tensor of
    `value`'s shape) is called in the step; register it with
    `keras.saving.register_keras_serializable` for the model to save.
    """
    if isinstance(importance, Importance):
        return importance
    names = {
        "l1": lambda: MagnitudeImportance(1),
        "l2": lambda: MagnitudeImportance(2),
        "taylor": TaylorImportance,
    }
    if isinstance(importance, str) and importance.lower() in names:
        return names[importance.lower()]()
    if callable(importance):
        return _Callable(importance)
    raise TypeError(
        "importance must be a maskfit.pruning.Importance (MagnitudeImportance,"
        " TaylorImportance), 'l1', 'l2', 'taylor', or a function (variable, value)"
        f" -> scores. Received: {importance!r}"
    )


def serialize(importance):
    if isinstance(importance, _Callable):
        return {"callable": keras.saving.serialize_keras_object(importance.function)}
    return keras.saving.serialize_keras_object(importance)


def deserialize(config):
    if isinstance(config, dict) and set(config) == {"callable"}:
        return _Callable(keras.saving.deserialize_keras_object(config["callable"]))
    return keras.saving.deserialize_keras_object(config)
