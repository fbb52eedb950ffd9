"""Every private Keras and TensorFlow member maskfit touches, in one place.

Keras 3 has no public API for a few things a drop-in `keras.Model` needs. Each
accessor below names the private member it reads, what it is for, what public
API is missing, and the versions it was checked on. `PRIVATE_MEMBERS` lists them
all; `tests/test_internals.py` fails with the member's name when a Keras or
TensorFlow release removes one. No other maskfit module names a private member.
"""

import importlib

import keras

__all__ = [
    "PRIVATE_MEMBERS",
    "functional_class",
    "call_has_training_arg",
    "compute_loss",
    "loss_tracker",
    "unscale_loss_for_distribution",
]

# (where, member, what it is for). Checked on Keras 3.15.1 with TF 2.21.0.
PRIVATE_MEMBERS = (
    (
        "keras.src.models.functional",
        "Functional",
        "the functional model class, which Keras exports only through"
        " keras.src: `MaskedModel(inputs, outputs)` mixes it in without"
        " rewriting any class's bases.",
    ),
    (
        "keras.Model",
        "_call_has_training_arg",
        "whether `call` takes `training`: the stock train_step passes it only"
        " then; no public property says so.",
    ),
    (
        "keras.Model",
        "_compute_loss",
        "Keras's wrapper that calls a `compute_loss` override with or without"
        " the `training` argument (added in Keras 3.3); train_step must call"
        " it to support both kinds of override.",
    ),
    (
        "keras.Model",
        "_loss_tracker",
        "the `loss` metric the stock train_step updates; public `metrics`"
        " lists it only once the model has been trained or evaluated.",
    ),
    (
        "keras.src.losses.loss",
        "unscale_loss_for_distribution",
        "undoes the division by the number of replicas before the loss is"
        " tracked, as the stock train_step does.",
    ),
)


def _module(name):
    return importlib.import_module(name)


def functional_class():
    """Returns Keras's `Functional` model class."""
    return _module("keras.src.models.functional").Functional


def call_has_training_arg(model):
    """Whether `model.call` accepts a `training` argument."""
    return model._call_has_training_arg


def compute_loss(model, **kwargs):
    """Calls `model.compute_loss`, with `training` only if the override takes it."""
    return model._compute_loss(**kwargs)


def loss_tracker(model):
    """Returns the model's `loss` metric, or None before `compile()`."""
    return model._loss_tracker


def unscale_loss_for_distribution(loss):
    """Multiplies `loss` back by the number of replicas in sync."""
    return _module("keras.src.losses.loss").unscale_loss_for_distribution(loss)


def missing_members():
    """Returns `[(where, member)]` for every listed member this install lacks.

    Members of `keras.Model` are looked up on a small compiled model, since
    Keras sets some of them on the instance.
    """
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    missing = []
    for where, member, _ in PRIVATE_MEMBERS:
        if where == "keras.Model":
            owner = model
        else:
            try:
                owner = _module(where)
            except ImportError:
                missing.append((where, member))
                continue
        if not hasattr(owner, member):
            missing.append((where, member))
    return missing
