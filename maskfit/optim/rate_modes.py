"""How each optimizer takes a learning-rate multiplier m, and the Keras members that takes.

`KERAS_OPTIMIZERS` classifies every optimizer Keras ships (read in
keras/src/optimizers/*.py of Keras 3.10.0 and 3.15.1): all of them use their
learning rate only in `update_step` and in the decoupled weight decay, so
`learning_rate * m` there is exactly their own optimizer at learning rate x m
(`LEARNING_RATE`); the table says what else m means per class. A class that
overrides `update_step` is not known to do so, and gets `STEP` (m scales the
step it takes) unless it declares `maskfit_multiplier_mode`.
"""

import typing

import keras

from maskfit import internals

__all__ = [
    "KERAS_OPTIMIZERS",
    "LEARNING_RATE",
    "MODE_ATTRIBUTE",
    "STEP",
    "OptimizerRates",
    "keras_rates",
    "multiplier_mode",
]

LEARNING_RATE = "learning_rate"
STEP = "step"
# The class attribute an optimizer class sets to say how its `update_step`
# takes a multiplier: LEARNING_RATE (it uses `learning_rate` only as Keras's
# own optimizers do) or STEP.
MODE_ATTRIBUTE = "maskfit_multiplier_mode"


class OptimizerRates(typing.NamedTuple):
    """How a multiplier m acts on one Keras optimizer class.

    Attributes:
      mode: `LEARNING_RATE`: `update_step` gets `learning_rate * m`, which is
        exactly its own optimizer at learning rate x m.
      linear: whether its update is linear in the learning rate: one step
        from the same state moves each entry by m times the stock step.
      divides: whether it divides by the learning rate, so m = 0 cannot be
        passed on: entries with m = 0 then run at m = 1 (they are frozen
        entries, which the training step puts back).
      note: what else m means, for the docs.
    """

    mode: str
    linear: bool
    divides: bool
    note: str


def _linear(note):
    return OptimizerRates(LEARNING_RATE, True, False, note)


# Read in keras/src/optimizers/*.py of Keras 3.10.0 and 3.15.1: every one uses
# `learning_rate` only inside `update_step` and the weight decay.
KERAS_OPTIMIZERS = {
    "SGD": _linear(
        "The velocity holds lr x gradient: with momentum, a step at a new m"
        " keeps the velocity built at the old one, as its own optimizer would."
    ),
    "Adam": _linear("lr scales the step; the moments never see it."),
    "AdamW": _linear("lr scales the step and the decoupled weight decay."),
    "Adamax": _linear("lr scales the step; the moments never see it."),
    "Nadam": _linear("lr scales the step; the moments never see it."),
    "RMSprop": _linear(
        "lr scales the increment; with momentum, the momentum holds lr-scaled"
        " increments, as SGD's velocity does."
    ),
    "Adagrad": _linear("lr scales the step; the accumulator never sees it."),
    "Adadelta": _linear(
        "lr scales the applied delta; the accumulated deltas are kept unscaled."
    ),
    "Ftrl": OptimizerRates(
        LEARNING_RATE,
        False,
        True,
        "lr enters the linear term and the closed-form weights, not as a factor"
        " of the step: m is its own optimizer at lr x m, not m times the step.",
    ),
    "Lion": _linear("lr scales the signed step; the momentum never sees it."),
    "Lamb": _linear(
        "The trust ratio is the variable's (weights and unscaled update): a"
        " per-entry m scales each entry's step, the ratio stays per variable."
    ),
    "Adafactor": OptimizerRates(
        LEARNING_RATE,
        False,
        False,
        "Its step size is min(lr, 1/sqrt(t)) x RMS(variable): lr x m is capped"
        " at 1/sqrt(t) as its own optimizer's would be, so m scales the step"
        " only below that cap.",
    ),
    "Muon": _linear(
        "lr scales the orthogonalized step (and, x adam_lr_ratio, the AdamW"
        " step of the variables it leaves to AdamW)."
    ),
    "ScheduleFreeAdamW": _linear(
        "lr scales the steps of its base sequence z; the weights interpolate"
        " between z and their average, so under a constant m the whole path"
        " moves m times as far."
    ),
}


def _keras_class_name(cls):
    """The name of `cls` in `keras.optimizers` if it is that very class, else None."""
    name = cls.__name__
    return name if getattr(keras.optimizers, name, None) is cls else None


def multiplier_mode(optimizer):
    """How `optimizer` (one that steps variables itself) takes multipliers.

    Returns:
      `LEARNING_RATE` when its `update_step` is that of a Keras optimizer in
      `KERAS_OPTIMIZERS` (a subclass that does not override it included), or
      its class says so with `maskfit_multiplier_mode = "learning_rate"`;
      `STEP` otherwise: m then scales the step its `update_step` took.

    Raises:
      TypeError: when its class overrides the weight decay
        (`_apply_weight_decay`) without declaring `maskfit_multiplier_mode`,
        or declares a mode that is neither.
    """
    cls = type(optimizer)
    declared = getattr(cls, MODE_ATTRIBUTE, None)
    if declared is not None:
        if declared not in (LEARNING_RATE, STEP):
            raise TypeError(
                f"{cls.__name__}.{MODE_ATTRIBUTE} must be {LEARNING_RATE!r} or"
                f" {STEP!r}. Received: {declared!r}"
            )
        return declared
    decay = internals.weight_decay_owner(cls)
    if not decay.__module__.startswith("keras."):
        raise TypeError(
            f"{cls.__name__} overrides the weight decay (in {decay.__name__}), so"
            " maskfit cannot tell whether its decay would follow a learning-rate"
            f" multiplier. Set `{MODE_ATTRIBUTE} = {LEARNING_RATE!r}` on the class"
            " if it uses `self.learning_rate` as Keras's optimizers do (or"
            f" {STEP!r} to scale each step it takes), or drop the override."
        )
    name = _keras_class_name(internals.defining_class(cls, "update_step"))
    return KERAS_OPTIMIZERS[name].mode if name in KERAS_OPTIMIZERS else STEP


def keras_rates(optimizer):
    """The `KERAS_OPTIMIZERS` entry whose `update_step` `optimizer` runs, or None."""
    name = _keras_class_name(internals.defining_class(type(optimizer), "update_step"))
    return KERAS_OPTIMIZERS.get(name)
