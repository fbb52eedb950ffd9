"""Task sequences for continual learning, from data that needs no download.

A sequence is a list of `Task`s that one network learns in turn:

- `split_<data>`: the 10 classes split into 5 tasks of 2 classes ((0, 1),
  (2, 3), ...), task-incremental: each task has a head of its own (2 logits),
  and at test time the task is known.
- `permuted_<data>`: `tasks` tasks of all 10 classes, one shared head; task 0
  is the data set as it is, task t > 0 the same examples with their features
  in a fixed random order (the permutations are drawn once from
  `PERMUTATION_SEED`, so every seed of a run sees the same tasks).

`<data>` is `mnist1d` or `digits` (`experiments.common.datasets`). Labels stay the
data set's own (0-9); a task's head is `label // classes_per_head` and its
class within the head `label % classes_per_head`, so that one loss serves
both kinds (`net.task_loss`).
"""

import dataclasses

import numpy as np

from experiments.common import datasets

__all__ = ["KINDS", "NAMES", "PERMUTATION_SEED", "Sequence", "Task", "load"]

KINDS = ("split", "permuted")
NAMES = tuple(f"{kind}_{data}" for kind in KINDS for data in datasets.NAMES)
# The permutations of the permuted sequences are the same for every run and seed.
PERMUTATION_SEED = 0
# Split sequences pair consecutive classes: 10 classes make 5 tasks.
_SPLIT_CLASSES = 2


@dataclasses.dataclass(frozen=True)
class Task:
    """One task: its training and test examples, and the head it answers with.

    Attributes:
      name: e.g. "classes 0-1" or "permutation 3".
      head: the index of the task's head in the network's output.
      x_train, y_train, x_test, y_test: float32 features and int32 labels
        (the data set's own labels).
    """

    name: str
    head: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@dataclasses.dataclass(frozen=True)
class Sequence:
    """Tasks learned one after the other by a network with `heads` heads.

    Attributes:
      name: one of `NAMES`.
      tasks: the tasks, in the order they are learned.
      heads: the heads of the network's output (one per task for split
        sequences, 1 for permuted ones).
      classes_per_head: the logits of each head.
      features: the features of every example.
    """

    name: str
    tasks: tuple
    heads: int
    classes_per_head: int
    features: int

    @property
    def multi_head(self):
        """Whether each task has a head of its own (task-incremental)."""
        return self.heads > 1


def _split(data):
    tasks = []
    for head in range(data.classes // _SPLIT_CLASSES):
        low = head * _SPLIT_CLASSES
        train = (data.y_train >= low) & (data.y_train < low + _SPLIT_CLASSES)
        test = (data.y_test >= low) & (data.y_test < low + _SPLIT_CLASSES)
        tasks.append(
            Task(
                name=f"classes {low}-{low + _SPLIT_CLASSES - 1}",
                head=head,
                x_train=data.x_train[train],
                y_train=data.y_train[train],
                x_test=data.x_test[test],
                y_test=data.y_test[test],
            )
        )
    return tasks, len(tasks), _SPLIT_CLASSES


def _permuted(data, count):
    rng = np.random.default_rng(PERMUTATION_SEED)
    tasks = []
    for index in range(count):
        order = np.arange(data.features)
        if index:
            order = rng.permutation(data.features)
        tasks.append(
            Task(
                name="original order" if index == 0 else f"permutation {index}",
                head=0,
                x_train=np.ascontiguousarray(data.x_train[:, order]),
                y_train=data.y_train,
                x_test=np.ascontiguousarray(data.x_test[:, order]),
                y_test=data.y_test,
            )
        )
    return tasks, 1, data.classes


def load(name, permuted_tasks=5, num_samples=None):
    """Returns the `Sequence` called `name`.

    Args:
      name: one of `NAMES`, e.g. "split_mnist1d" or "permuted_digits".
      permuted_tasks: how many tasks a permuted sequence has (split
        sequences always have 5).
      num_samples: for MNIST-1D, generate this many examples in all instead
        of 5,000 (quick tests); ignored for digits.

    Returns:
      A `Sequence`.

    Raises:
      ValueError: for a name not in `NAMES`.

    Example:

    >>> sequence = load("split_digits")
    >>> [task.name for task in sequence.tasks][:2], sequence.heads
    (['classes 0-1', 'classes 2-3'], 5)
    """
    if name not in NAMES:
        raise ValueError(
            f"Received an unknown task sequence, expected one of {', '.join(NAMES)}."
            f" Received: sequence={name!r}"
        )
    kind, data_name = name.split("_", 1)
    kwargs = {"num_samples": num_samples} if data_name == "mnist1d" else {}
    data = datasets.load(data_name, **kwargs)
    if kind == "split":
        tasks, heads, per_head = _split(data)
    else:
        tasks, heads, per_head = _permuted(data, permuted_tasks)
    return Sequence(name, tuple(tasks), heads, per_head, data.features)
