"""Private members of Keras's JAX trainer that maskfit's JAX backend calls.

And the one a callback needs under that trainer (`callback_model`). Checked
on Keras 3.15.1 with JAX 0.10.2 (`Callback._model` on Keras 3.10.0 too).
"""

import importlib

import keras

_TRAINER = "keras.src.backend.jax.trainer"

# (where, member, what it is for).
PRIVATE_MEMBERS = (
    (
        f"{_TRAINER}.JAXTrainer",
        "_update_metrics_variables",
        "the stateless update of the loss tracker and the compiled metrics"
        " that ends the JAX `train_step`; the masked step ends the same way"
        " (no public stateless counterpart of `compute_metrics` exists).",
    ),
    (
        f"{_TRAINER}.JAXTrainer",
        "_make_function",
        "wraps a step `(state, data)` into the `(state, iterator)` function"
        " `fit` calls, running `steps_per_execution` steps; the masked train"
        " function is wrapped the same way. It calls the step once per step"
        " (a Python loop), so mask rules update between the steps of one"
        " execution.",
    ),
    (
        "keras.callbacks.Callback",
        "_model",
        "the model a callback was given, read without `Callback.model`, which"
        " under JAX writes the trainer's state into the model's variables"
        " (`jax_state_sync`) on every read: the exact backup reads the model at"
        " every step and needs the state written only when it backs up.",
    ),
)

# Read where the Keras release has it, and not required: Keras 3.10 (the
# oldest supported) has no `_get_state_sharding_spec`; `state_shardings`
# then reads the same lists from the variables' public `.value.sharding`.
OPTIONAL_MEMBERS = (
    (
        f"{_TRAINER}.JAXTrainer",
        "_get_state_sharding_spec",
        "the shardings of the state under a `keras.distribution`, which the"
        " compiled step is given as its output shardings, as Keras does"
        " (with its check that the state's shardings agree).",
    ),
)


def callback_model(callback):
    """The model of `callback`, without syncing the JAX trainer's state into it."""
    return callback._model


def update_metrics_variables(model, metrics_values, loss, x, y, y_pred, sample_weight):
    """Returns `(logs, new metrics values)`: the JAX trainer's metrics update."""
    return model._update_metrics_variables(
        metrics_values, loss, x, y, y_pred, sample_weight
    )


def step_function(model, step):
    """`step(state, data)` as the `(state, iterator)` function `fit` calls."""
    return model._make_function(step)


def state_shardings(model):
    """The shardings of `(trainable, non-trainable, optimizer, metrics)` state."""
    getter = getattr(model, "_get_state_sharding_spec", None)
    if getter is not None:
        return getter()
    optimizer = getattr(model, "optimizer", None)
    optimizer_variables = [] if optimizer is None else optimizer.variables
    return tuple(
        [v.value.sharding for v in variables]
        for variables in (
            model.trainable_variables,
            model.non_trainable_variables,
            optimizer_variables,
            model.metrics_variables,
        )
    )


def missing_members():
    """Returns `[(where, member)]` for every listed member this install lacks.

    Nothing is missing where JAX is not installed: the members are then
    never called.
    """
    try:
        trainer = importlib.import_module(_TRAINER).JAXTrainer
    except ImportError:
        return []
    callback = keras.callbacks.Callback()
    return [
        (w, m)
        for w, m, _ in PRIVATE_MEMBERS
        if not hasattr(callback if w == "keras.callbacks.Callback" else trainer, m)
    ]
