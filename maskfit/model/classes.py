"""`MaskedModel` and `MaskedSequential`: Keras models whose `fit` honours layer masks."""

import keras

from maskfit import internals
from maskfit.model import persistence, training

__all__ = ["MaskedModel", "MaskedSequential"]


@keras.saving.register_keras_serializable(package="maskfit")
class MaskedModel(training.MaskedTraining, persistence.MaskedPersistence, keras.Model):
    """A `keras.Model` whose training step applies the masks set on its layers.

    Use it like `keras.Model`: as `MaskedModel(inputs, outputs)`, or as a base
    class (built in `build()`, or lazily by the first `fit`). Declare masks on
    layers with `maskfit.set_mask`; `compile()`, `fit()`, `train_on_batch()`,
    `evaluate()` and `predict()` then work as usual, and every entry whose
    mask is 0 stays bit-identical through training under any Keras optimizer
    and setting (weight decay, momentum, EMA, clipping, gradient
    accumulation, loss scaling). A model without masks trains exactly like
    `keras.Model`: the step is Keras's own, with the same hooks
    (`compute_loss` with or without `training`, `compute_metrics`, the loss
    metric, the warning for a model without trainable weights).

    The masks are traced once, as state: changing a mask's values with
    `set_mask` between two `fit` calls needs no `compile()` and no retrace.
    `apply_grad_masks` is the override point for subclasses that transform
    gradients. Saving, `load_model`, legacy `.h5`, `pickle` and
    `copy.deepcopy` keep the masks.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> inputs = keras.Input((1,))
    >>> hidden = keras.layers.Dense(16, activation="relu")(inputs)
    >>> head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> model = maskfit.MaskedModel(inputs, head(hidden))
    >>> model.compile(optimizer="adamw", loss="mse")
    >>> before = head.kernel.numpy()[:, 1].copy()
    >>> _ = model.fit(np.ones((8, 1)), np.ones((8, 2)), epochs=2, verbose=0)
    >>> bool((head.kernel.numpy()[:, 1] == before).all())
    True
    """

    def __new__(cls, *args, **kwargs):
        if _functional_arguments(args, kwargs):
            cls = _functional_variant(cls)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        if _functional_arguments(args, kwargs):
            # keras.Model.__init__ would put Functional into the bases of this
            # class and of every class above it up to keras.Model, for the
            # rest of the process: MaskedModel itself would become functional.
            # The instance takes a functional variant of its class instead
            # (a subclass whose __init__ passes inputs and outputs up reaches
            # here as a plain instance).
            functional = internals.functional_class()
            if not isinstance(self, functional):
                internals.set_untracked(
                    self, "__class__", _functional_variant(type(self))
                )
            functional.__init__(self, *args, **kwargs)
        else:
            super().__init__(*args, **kwargs)


@keras.saving.register_keras_serializable(package="maskfit")
class MaskedSequential(
    training.MaskedTraining, persistence.MaskedPersistence, keras.Sequential
):
    """A `keras.Sequential` whose training step applies the masks set on its layers.

    Everything `MaskedModel` promises holds for it; use it wherever you would
    use `keras.Sequential`.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([0, 1]))
    >>> model = maskfit.MaskedSequential([keras.Input((3,)), head])
    >>> model.compile(optimizer="adam", loss="mse")
    >>> before = head.kernel.numpy()[:, 0].copy()
    >>> _ = model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    >>> bool((head.kernel.numpy()[:, 0] == before).all())
    True
    """


def _functional_arguments(args, kwargs):
    """Whether a model constructor call is the functional `(inputs, outputs)` form."""
    return (
        len(args) == 2
        or (len(args) == 1 and "outputs" in kwargs)
        or ("inputs" in kwargs and "outputs" in kwargs)
    )


_functional_variants = {}


def _functional_variant(cls):
    """Returns `cls` with Functional mixed in, made once per class.

    The variant serializes under `cls`'s registered name, and that name still
    deserializes to `cls`, whose constructor makes the variant again: no
    class is ever changed, and saved models need no `custom_objects`.
    """
    functional = internals.functional_class()
    if issubclass(cls, functional):
        return cls
    if cls not in _functional_variants:
        variant = type(
            cls.__name__,
            (cls, functional),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
        package, _, name = keras.saving.get_registered_name(cls).rpartition(">")
        if package:
            keras.saving.register_keras_serializable(package, name)(variant)
            keras.saving.register_keras_serializable(package, name)(cls)
        _functional_variants[cls] = variant
    return _functional_variants[cls]


# Legacy `.h5` files name a model's class without its package ("MaskedModel"),
# so `keras.saving.load_model` finds it among the global custom objects.
for _cls in (MaskedModel, MaskedSequential):
    keras.saving.get_custom_objects().setdefault(_cls.__name__, _cls)
