"""The TensorFlow backend: Keras's TensorFlow `train_step` with the masking stage in it.

The step runs on the stateful masker (`maskfit.step.masker`): masks as
`tf.Variable` state, planned and traced by the model's
`maskfit.step.lifecycle.StepLifecycle`, split in two under XLA when rules
run in it (`maskfit.step.split`). `maskfit.apply_gradients` is
`maskfit.apply.apply_gradients`.
"""

import warnings

import keras
import tensorflow as tf

from maskfit import internals
from maskfit.apply import apply_gradients
from maskfit.model import training
from maskfit.step import pipeline

__all__ = [
    "apply_grad_masks",
    "apply_gradients",
    "make_train_function",
    "mask_memory",
    "train_step",
]


def train_step(model, data):
    """`MaskedModel.train_step` on TensorFlow: Keras's own, line for line, masked."""
    lifecycle = model._maskfit_lifecycle()
    if lifecycle.split is not None and not internals.tracing_for_xla():
        # Traced without XLA around the two compiled variants of this step.
        return lifecycle.split(data)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    masker = lifecycle.masker_for(model._all_trainable_weights())
    view = None
    if masker is not None:
        view = masker.begin_step(model.optimizer, model._maskfit_update_mode(masker))

    # Forward pass
    with tf.GradientTape() as tape:
        if internals.call_has_training_arg(model):
            y_pred = model(x, training=True)
        else:
            y_pred = model(x)
        loss = internals.compute_loss(
            model,
            x=x,
            y=y,
            y_pred=y_pred,
            sample_weight=sample_weight,
            training=True,
        )
        internals.loss_tracker(model).update_state(
            internals.unscale_loss_for_distribution(loss),
            sample_weight=tf.shape(
                next(i for i in tf.nest.flatten(x) if i is not None)
            )[0],
        )
        if model.optimizer is not None:
            loss = model.optimizer.scale_loss(loss)

    # Compute gradients, mask them, and update the weights
    variables = model._all_trainable_weights()
    if variables:
        if masker is None:
            # Keras built the model in this trace: its variables exist now.
            masker = lifecycle.plan_in_trace(variables)
            mode = model._maskfit_update_mode(masker)
            view = masker.begin_step(model.optimizer, mode)
        # Variables left out (mask all 0) get no gradient and no update.
        gradients = masker.spread(tape.gradient(loss, masker.active(variables)))
        pipeline.run(
            masker,
            view,
            gradients,
            mask=lambda gradients: model.apply_grad_masks(gradients, variables),
        )
    else:
        warnings.warn("The model does not have any trainable weights.", stacklevel=3)

    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def make_train_function(model, force=False):
    """`make_train_function` on TensorFlow: retraces only when the masks' structure changed."""
    return model._maskfit_lifecycle().make(force=force)


def apply_grad_masks(model, gradients, variables):
    """`MaskedModel.apply_grad_masks` on TensorFlow: the masker's masking."""
    lifecycle = model._maskfit_lifecycle()
    masker = lifecycle.masker_for(variables) or lifecycle.plan_in_trace(variables)
    return masker.mask_gradients(gradients)


def mask_memory(model):
    """Per masked variable, the bytes of its mask state and its own, per device.

    Returns:
      `[(path, {device: bytes}, {device: bytes})]`, in the step's order: the
      mask state the step holds (`GradientMasker.mask_variables`: one copy
      per replica under a `tf.distribute` strategy), and the variable's.
      Empty before the step is planned (the first `fit`).
    """
    masker = training.masker_of(model)
    if masker is None:
        return []
    variables = masker.variables
    return [
        (variables[p].path, _bytes_per_device(held), _bytes_per_device([variables[p]]))
        for p, held in masker.mask_variables().items()
    ]


def _bytes_per_device(variables):
    """`{device: bytes}` of `tf.Variable`s (each replica's copy of a mirrored one)."""
    found = {}
    for variable in variables:
        variable = variable.value if isinstance(variable, keras.Variable) else variable
        for part in getattr(variable, "values", None) or (variable,):
            size = part.shape.num_elements() * part.dtype.size
            found[part.device] = found.get(part.device, 0) + size
    return found
