"""The baselines PackNet is compared with: fine-tuning and separate networks.

Every method has the same interface, which `experiments.continual_learning.lib` drives:
`learn(task_index, task)` learns the next task, `logits(task_index, task, x)`
is the network's answer to an earlier (or the current) task, and `networks`
lists the networks it trains (for their size).

- `FineTune`: one network trained on each task in turn, every weight
  learnable: the forgetting baseline.
- `Separate`: a fresh network per task, each narrower so that all of them
  together have about the parameters of the one network (the upper bound:
  nothing is shared, so nothing is forgotten, but each task has 1/T of the
  capacity). Each has a single head trained on the task's classes.

With a head per task, only the current task's head columns learn (as a
PyTorch head that gets no gradient does not move), also under weight decay.
"""

import maskfit
from experiments.continual_learning import net

__all__ = [
    "FineTune",
    "Separate",
    "TaskTraining",
    "learn_heads_only",
    "separate_hidden_units",
]


def learn_heads_only(network, head):
    """Declares masks so that of the head layer only `head`'s columns learn.

    Every other layer learns in full. Does nothing for a single shared head.
    """
    if network.heads == 1:
        return
    columns = network.head_columns(head)
    maskfit.set_mask(
        network.layers[-1],
        maskfit.ElementMask({"kernel": columns[None, :], "bias": columns}),
    )


class TaskTraining:
    """Trains the one network of a method on a task, the batches seeded by both.

    For a method with the attributes `network`, `_settings`, `_seed` and
    `_epochs` (fine-tuning, EWC, PackNet).
    """

    def train_task(self, task_index, task, epochs=None, phase=0):
        """Trains on `task` for `epochs` (default `_epochs`) passes.

        `phase` tells apart two trainings on one task (PackNet retrains).
        """
        self.network.train(
            self._settings,
            task.x_train,
            task.y_train,
            self._epochs if epochs is None else epochs,
            [self._seed, task_index, phase],
        )


class FineTune(TaskTraining):
    """One network trained on every task in turn."""

    name = "finetune"

    def __init__(self, network, settings, seed, epochs):
        self.network = network
        self.networks = [network]
        self._settings = settings
        self._seed = seed
        self._epochs = epochs

    def learn(self, task_index, task):
        learn_heads_only(self.network, task.head)
        self.train_task(task_index, task)

    def logits(self, task_index, task, x):
        return self.network.task_logits(self._settings, x, task.head)


def separate_hidden_units(features, hidden_units, sequence, tasks):
    """Hidden widths of `tasks` one-head networks as large as one network in all.

    Every hidden layer is scaled by the same factor, the largest for which
    `tasks` networks (each with one head of `sequence.classes_per_head`
    logits) have at most the parameters of the one network with all heads.

    Example:

    >>> from types import SimpleNamespace
    >>> sequence = SimpleNamespace(heads=1, classes_per_head=10)
    >>> separate_hidden_units(40, (100, 100), sequence, tasks=4)
    (40, 40)
    """
    budget = net.parameter_count(
        features, hidden_units, sequence.heads * sequence.classes_per_head
    )

    def scaled(factor):
        return tuple(max(1, int(round(factor * u))) for u in hidden_units)

    def fits(factor):
        size = net.parameter_count(features, scaled(factor), sequence.classes_per_head)
        return tasks * size <= budget

    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return scaled(low)


class Separate:
    """A fresh, narrower network per task (`separate_hidden_units`)."""

    name = "separate"

    def __init__(self, make_network, settings, seed, epochs):
        """`make_network(task_index)` builds task `task_index`'s network."""
        self.networks = []
        self._make_network = make_network
        self._settings = settings
        self._seed = seed
        self._epochs = epochs

    def learn(self, task_index, task):
        network = self._make_network(task_index)
        self.networks.append(network)
        per_head = network.classes_per_head
        network.train(
            self._settings,
            task.x_train,
            task.y_train % per_head,
            self._epochs,
            [self._seed, task_index, 0],
        )

    def logits(self, task_index, task, x):
        return self.networks[task_index].task_logits(self._settings, x, 0)
