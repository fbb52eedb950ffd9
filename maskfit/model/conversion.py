"""Model conversion: any Keras model as one that trains with masks.

`masked_model` is what pruning (`maskfit.pruning`, `maskfit.structured`)
and sparse training (`maskfit.sparse`) call on the model they are given:
it returns the model if it is a `MaskedModel` already, else a
`MaskedSequential` / `MaskedModel` with its layers and weights, or a
`PrunedModel` that runs a subclassed model.
"""

import keras

from maskfit import internals
from maskfit.model import classes

__all__ = ["PrunedModel", "masked_model"]


def masked_model(model):
    """`model` if it trains with masks, else a masked model with its layers and weights.

    A plain `keras.Sequential` gives a `MaskedSequential`, a functional
    `keras.Model` a `MaskedModel`, a subclassed one a `PrunedModel` that runs
    it; what rules declare (pruning, `maskfit.sparse`) needs one of those.

    Raises:
      ValueError: for a subclassed model that overrides `train_step` or
        `compute_loss`, which the masked step would bypass.
    """
    if isinstance(model, (classes.MaskedModel, classes.MaskedSequential)):
        return model
    if isinstance(model, keras.Sequential):
        layers = list(model.layers)
        if model.built and getattr(model, "inputs", None):
            source = model.inputs[0]
            layers = [
                keras.Input(batch_shape=source.shape, dtype=source.dtype)
            ] + layers
        return classes.MaskedSequential(layers, name=model.name)
    if isinstance(model, internals.functional_class()):
        return classes.MaskedModel(model.inputs, model.outputs, name=model.name)
    for method in ("train_step", "compute_loss"):
        if getattr(type(model), method) is not getattr(keras.Model, method):
            raise ValueError(
                f"Model '{model.name}' ({type(model).__name__}) overrides"
                f" {method}(), which pruning would bypass: it trains in"
                " MaskedModel's step. Derive the class from maskfit.MaskedModel"
                " instead of keras.Model (keep your override, calling"
                f" super().{method}() for the masked part), then prune it."
            )
    return PrunedModel(model)


@keras.saving.register_keras_serializable(package="maskfit")
class PrunedModel(classes.MaskedModel):
    """A `MaskedModel` that runs a subclassed `keras.Model`, to prune it.

    `prune_low_magnitude` returns one for a subclassed model that is not a
    `MaskedModel`; `strip_pruning` returns the model it runs. It has the
    model's layers and weights (the same objects and paths), and passes
    `training` to it. Saving it needs the model's class to be serializable,
    as saving the model itself does.

    Args:
      model: a `keras.Model`, built or not.
      **kwargs: `keras.Model` arguments (`name`, `trainable`, `dtype`).

    Example:

    >>> import keras, numpy as np, maskfit.pruning as pruning
    >>> class Net(keras.Model):  # subclassed: its call() is Python code
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.dense = keras.layers.Dense(2)
    ...     def call(self, x):
    ...         return self.dense(x)
    >>> net = Net()
    >>> _ = net(np.zeros((1, 3)))
    >>> pruned = pruning.prune_low_magnitude(net)
    >>> type(pruned).__name__, pruned.model is net
    ('PrunedModel', True)
    >>> pruning.strip_pruning(pruned) is net
    True
    """

    def __init__(self, model, **kwargs):
        kwargs.setdefault("name", f"pruned_{model.name}")
        super().__init__(**kwargs)
        self.model = model
        if model.built:
            self.built = True

    def call(self, inputs, training=None):
        return self.model(inputs, training=training)

    def get_config(self):
        config = super().get_config()
        config["model"] = keras.saving.serialize_keras_object(self.model)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["model"] = keras.saving.deserialize_keras_object(
            config["model"], custom_objects=custom_objects
        )
        return super().from_config(config, custom_objects=custom_objects)
