"""`MaskedModel`: a Keras model whose `fit` honours the gradient masks of its layers."""

import keras
import tensorflow as tf

# Keras exposes the functional model class only through keras.src.
from keras.src.models.functional import Functional

from maskfit import declare
from maskfit import mask_config
from maskfit import masker as masker_lib

__all__ = ["MaskedModel"]


@keras.saving.register_keras_serializable(package="maskfit")
class MaskedModel(keras.Model):
    """A `keras.Model` whose training step applies the masks set on its layers.

    Use it like `keras.Model`: as `MaskedModel(inputs, outputs)` or as a base
    class. Declare masks on layers with `maskfit.set_mask`; `compile()`,
    `fit()`, `train_on_batch()`, `evaluate()` and `predict()` then work as usual,
    and every entry whose mask is 0 stays bit-identical through training under
    any Keras optimizer and setting (weight decay, momentum, EMA, clipping,
    gradient accumulation, loss scaling). A model without masks trains exactly
    like `keras.Model`.

    The step follows Keras's own order: unpack the data, forward pass and
    `compute_loss` under the tape, `optimizer.scale_loss`, gradients, then one
    masking stage (`apply_grad_masks`, the override point for subclasses that
    transform gradients), `optimizer.apply`, the loss metric and
    `compute_metrics`. The masks are traced once, as state: changing a mask's
    values with `set_mask` between two `fit` calls needs no `compile()` and no
    retrace.

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
        if isinstance(self, Functional) and _functional_arguments(args, kwargs):
            # keras.Model.__init__ would rewrite the class's bases to put
            # Functional in them, for good: after `MaskedModel(inputs, outputs)`
            # a subclassed `MaskedModel` could no longer be made. The instance's
            # class is already a functional variant (see `__new__`).
            Functional.__init__(self, *args, **kwargs)
        else:
            super().__init__(*args, **kwargs)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        variables = self.trainable_variables
        masker = self._masker_for(variables)
        if masker.scheduled:
            masker.begin_step(self.optimizer.iterations)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            scaled_loss = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, variables)
        gradients = self.apply_grad_masks(gradients, variables)
        # A subclass's stage may change gradients after masking: then restore
        # frozen entries whatever the optimizer.
        masked = type(self).apply_grad_masks is MaskedModel.apply_grad_masks
        masker.apply(self.optimizer, gradients, variables, masked=masked)
        self._track_loss(loss, x)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def apply_grad_masks(self, gradients, variables):
        """The masking stage: returns the gradients that `optimizer.apply` gets.

        The default zeroes the gradient of every frozen entry (NaN and Inf
        included) and scales those of partially masked ones. Override it to
        transform gradients (add noise, clip per layer) and call
        `super().apply_grad_masks(...)` to keep the masks; whatever a subclass
        does here, entries whose mask is 0 are restored after the update.

        Args:
          gradients: one gradient (or None) per variable, as from the tape.
          variables: `self.trainable_variables`, in the same order.

        Returns:
          The list of gradients to apply, aligned with `variables`.
        """
        return self._masker_for(variables).mask_gradients(gradients)

    def make_train_function(self, force=False):
        """Builds the step; retraces only when the masks' structure changed."""
        with self.distribute_strategy.scope():
            retrace = self._sync_masker()
        return super().make_train_function(force=force or retrace)

    def _sync_masker(self):
        variables = self.trainable_variables
        current = getattr(self, "_maskfit_masker", None)
        if current is not None and [id(v) for v in current._variables] == [
            id(v) for v in variables
        ]:
            return current.update()
        masker = masker_lib.GradientMasker(
            variables, lambda: declare.masked_layers(self), step=self._optimizer_step
        )
        object.__setattr__(self, "_maskfit_masker", masker)
        return True

    def _masker_for(self, variables):
        current = getattr(self, "_maskfit_masker", None)
        if current is None:
            self._sync_masker()
            current = self._maskfit_masker
        if len(current._variables) != len(variables):
            raise ValueError(
                "The model's trainable variables changed after its training step"
                f" was built ({len(current._variables)} then {len(variables)})."
                " Call fit() or make_train_function() to rebuild it."
            )
        return current

    def _optimizer_step(self):
        optimizer = getattr(self, "optimizer", None)
        if optimizer is None or not optimizer.built:
            return 0
        return int(keras.ops.convert_to_numpy(optimizer.iterations))

    def get_config(self):
        config = super().get_config()
        grad_masks = mask_config.masks_to_config(self)
        if grad_masks:
            config["grad_masks"] = grad_masks
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        grad_masks = config.pop("grad_masks", None)
        model = super().from_config(config, custom_objects=custom_objects)
        if grad_masks:
            mask_config.masks_from_config(model, grad_masks)
        return model

    def _track_loss(self, loss, x):
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:
            loss = loss * replicas
        first = next(t for t in tf.nest.flatten(x) if t is not None)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss, sample_weight=tf.shape(first)[0])


def _functional_arguments(args, kwargs):
    """Whether a model constructor call is the functional `(inputs, outputs)` form."""
    return (
        len(args) == 2
        or (len(args) == 1 and "outputs" in kwargs)
        or ("inputs" in kwargs and "outputs" in kwargs)
    )


_functional_variants = {}


def _functional_variant(cls):
    """Returns `cls` with Functional mixed in, made once per class, serializable."""
    if issubclass(cls, Functional):
        return cls
    if cls not in _functional_variants:
        variant = type(
            cls.__name__,
            (cls, Functional),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
        package, _, name = keras.saving.get_registered_name(cls).rpartition(">")
        if package:
            keras.saving.register_keras_serializable(package, name)(variant)
        _functional_variants[cls] = variant
    return _functional_variants[cls]
