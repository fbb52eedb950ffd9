"""Private members of Keras's JAX trainer that maskfit's JAX backend calls.

Checked on Keras 3.15.1 with JAX 0.10.2.
"""

import importlib

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
        " function is wrapped the same way.",
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
    return [(w, m) for w, m, _ in PRIVATE_MEMBERS if not hasattr(trainer, m)]
