"""One training budget for both frameworks: the optimizer, the batches, the phases.

A structured-pruning run trains dense for `Budget.epochs`, then prunes in
`Budget.prune_steps` equal steps spread over `Budget.prune_epochs`, then
fine-tunes for `Budget.finetune_epochs`. `batches` gives the example
indices of every step of a seed's run (a fresh permutation of the training
set per epoch, cut into full batches), so Keras (`keras_fit` here) and
PyTorch (`benchmarks.torch_train`) see the same batches in the same order;
`pruning_steps` gives the steps at which each pruning step happens, before
that step's update. `keras_optimizer` and the PyTorch one are the same
algorithm with the same hyperparameters ("adam": Adam with beta 0.9/0.999
and epsilon 1e-7 (Keras's default; PyTorch applies it after the bias
correction of the second moment, Keras before, a difference of order
1e-7); "sgd": SGD with momentum 0.9, which is the same update in both).
"""

import dataclasses
import numbers

import keras
import numpy as np

__all__ = [
    "Budget",
    "OPTIMIZERS",
    "batches",
    "compile_keras",
    "evaluate_keras",
    "keras_fit",
    "keras_optimizer",
    "pruning_steps",
    "steps_per_epoch",
]

OPTIMIZERS = ("adam", "sgd")
ADAM_EPSILON = 1e-7
SGD_MOMENTUM = 0.9


@dataclasses.dataclass(frozen=True)
class Budget:
    """The training of one run, the same in every framework.

    Attributes:
      optimizer: "adam" or "sgd" (with momentum 0.9).
      learning_rate: constant learning rate.
      batch_size: examples per step; each epoch drops its last partial batch.
      epochs: dense training epochs before pruning starts.
      prune_epochs: epochs over which the pruned fraction grows to its
        target, in `prune_steps` equal steps (the first at the start).
      prune_steps: pruning steps (Torch-Pruning's `iterative_steps`).
      finetune_epochs: epochs after the last pruning step's epoch.
    """

    optimizer: str = "adam"
    learning_rate: float = 1e-3
    batch_size: int = 64
    epochs: int = 20
    prune_epochs: int = 5
    prune_steps: int = 5
    finetune_epochs: int = 10

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"Received an invalid value for `optimizer`, expected one of"
                f" {OPTIMIZERS}. Received: optimizer={self.optimizer!r}"
            )
        for name in ("batch_size", "epochs", "prune_epochs", "prune_steps"):
            _check_int(name, getattr(self, name), 1)
        _check_int("finetune_epochs", self.finetune_epochs, 0)
        if not self.learning_rate > 0:
            raise ValueError(
                "Received an invalid value for `learning_rate`, expected a"
                f" positive number. Received: learning_rate={self.learning_rate!r}"
            )

    @property
    def total_epochs(self):
        """Epochs of the whole run: dense, pruning and fine-tuning."""
        return self.epochs + self.prune_epochs + self.finetune_epochs


def _check_int(name, value, minimum):
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        raise ValueError(
            f"Received an invalid value for `{name}`, expected an integer of at"
            f" least {minimum}. Received: {name}={value!r}"
        )


def steps_per_epoch(examples, budget):
    """Full batches per epoch.

    Raises:
      ValueError: if there are fewer examples than one batch.
    """
    steps = examples // budget.batch_size
    if steps < 1:
        raise ValueError(
            f"Received {examples} training examples, fewer than one batch of"
            f" batch_size={budget.batch_size}; use a smaller batch size."
        )
    return steps


def batches(examples, budget, seed, first_epoch, last_epoch):
    """The example indices of every step of epochs `[first_epoch, last_epoch)`.

    Epoch `e` of seed `seed` is a permutation drawn from
    `np.random.default_rng([seed, e])`, cut into `steps_per_epoch` full
    batches; the same in every framework and independent of earlier epochs.

    Returns:
      An int64 array of shape `(steps, batch_size)`.

    Example:

    >>> budget = Budget(batch_size=4)
    >>> batches(10, budget, seed=0, first_epoch=0, last_epoch=2).shape
    (4, 4)
    """
    per_epoch = steps_per_epoch(examples, budget)
    used = per_epoch * budget.batch_size
    rows = [
        np.random.default_rng([seed, epoch]).permutation(examples)[:used]
        for epoch in range(first_epoch, last_epoch)
    ]
    if not rows:
        return np.zeros((0, budget.batch_size), np.int64)
    return np.concatenate(rows).reshape(-1, budget.batch_size).astype(np.int64)


def pruning_steps(examples, budget):
    """The global steps (0-based) before whose update each pruning step happens.

    The `prune_steps` steps are spread evenly over the `prune_epochs` epochs
    that follow the dense ones; the first is at the first of those steps.

    Example:

    >>> pruning_steps(640, Budget(batch_size=64, epochs=2, prune_epochs=1, prune_steps=5))
    [20, 22, 24, 26, 28]
    """
    per_epoch = steps_per_epoch(examples, budget)
    begin = budget.epochs * per_epoch
    span = budget.prune_epochs * per_epoch
    return [begin + (k * span) // budget.prune_steps for k in range(budget.prune_steps)]


def keras_optimizer(budget):
    """A new Keras optimizer of `budget`."""
    if budget.optimizer == "adam":
        return keras.optimizers.Adam(budget.learning_rate, epsilon=ADAM_EPSILON)
    return keras.optimizers.SGD(budget.learning_rate, momentum=SGD_MOMENTUM)


def keras_fit(model, data, budget, seed, first_epoch, last_epoch, callbacks=()):
    """Trains a compiled Keras model on the batches of epochs `[first_epoch, last_epoch)`.

    One `fit` call over the batches in `batches`' order (`shuffle=False`),
    so a pruning schedule counted in steps sees one continuous run.

    Args:
      model: a compiled Keras model (`keras_optimizer(budget)`, sparse
        categorical cross-entropy on logits).
      data: an `experiments.common.datasets.Split`.
      budget: a `Budget`.
      seed: the run's seed (the batch order).
      first_epoch, last_epoch: the epochs to train.
      callbacks: Keras callbacks for `fit`.

    Returns:
      The `History` of `fit`, or None when there is nothing to train.
    """
    order = batches(len(data.x_train), budget, seed, first_epoch, last_epoch).ravel()
    if not len(order):
        return None
    return model.fit(
        data.x_train[order],
        data.y_train[order],
        batch_size=budget.batch_size,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
    )


def compile_keras(model, budget, jit_compile=False):
    """Compiles `model` with `budget`'s optimizer, cross-entropy on logits and accuracy."""
    model.compile(
        optimizer=keras_optimizer(budget),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=jit_compile,
    )
    return model


def evaluate_keras(model, x, y, batch_size=512):
    """Accuracy of `model`'s logits on `(x, y)`, at inference (batch norm frozen)."""
    logits = model.predict(x, batch_size=batch_size, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == y))
