"""A pruning schedule evaluated on the host: its values and pruning steps, as the step sees them."""

import numpy as np
import tensorflow as tf

from maskfit.spec.pruning_schedule import (
    ConstantSparsity,
    PolynomialDecay,
    PruningSchedule,
)

__all__ = [
    "ConstantSparsity",
    "PolynomialDecay",
    "PruningSchedule",
    "pruning_steps",
    "schedule_table",
]


def schedule_table(schedule, steps, jit_compile=False):
    """Evaluates `schedule` at each of `steps`, as a compiled training step does.

    Each step is evaluated on its own, in a `tf.function` (XLA-compiled with
    `jit_compile=True`), so the values are those the training step computes
    in that mode. (TensorFlow's graph rewrites turn `pow(x, 3)` into
    multiplications and a division by a constant into a multiplication, so
    eager, graph and XLA can differ in the last bit of the sparsity.) Any
    callable with the `PruningSchedule` contract works, TF-MOT's included.

    Args:
      schedule: a `PruningSchedule` (or TF-MOT schedule).
      steps: an iterable of integer steps.
      jit_compile: whether to evaluate as under `jit_compile=True`.

    Returns:
      `(should_prune, sparsity)`: a bool and a float32 numpy array, one entry
      per step.

    Example:

    >>> import maskfit.pruning as pruning
    >>> should_prune, sparsity = pruning.schedule_table(
    ...     pruning.ConstantSparsity(0.5, 0, frequency=2), range(4))
    >>> should_prune.tolist(), sparsity.tolist()
    ([True, False, True, False], [0.5, 0.5, 0.5, 0.5])
    """
    steps = np.asarray(list(steps), dtype=np.int64)

    @tf.function(jit_compile=jit_compile)
    def evaluate(step):
        should_prune, sparsity = schedule(step)
        return tf.cast(should_prune, tf.bool), tf.cast(sparsity, tf.float32)

    should_prune = np.zeros(steps.shape, bool)
    sparsity = np.zeros(steps.shape, np.float32)
    for i, step in enumerate(steps):
        prune, value = evaluate(tf.constant(step, tf.int64))
        should_prune[i], sparsity[i] = prune.numpy(), value.numpy()
    return should_prune, sparsity


def pruning_steps(schedule, start, stop, jit_compile=False):
    """Lists the steps in `[start, stop)` at which `schedule` prunes.

    Args:
      schedule: a `PruningSchedule` (or TF-MOT schedule).
      start: the first step to look at.
      stop: the step after the last one to look at.
      jit_compile: evaluate as under `jit_compile=True` (see `schedule_table`).

    Returns:
      A list of `(step, sparsity)`, `step` an int and `sparsity` the float32
      value as a Python float.

    Example:

    >>> import maskfit.pruning as pruning
    >>> pruning.pruning_steps(pruning.ConstantSparsity(0.75, 0, 200, 100), 0, 1000)
    [(0, 0.75), (100, 0.75), (200, 0.75)]
    """
    steps = np.arange(start, stop, dtype=np.int64)
    should_prune, sparsity = schedule_table(schedule, steps, jit_compile=jit_compile)
    return [
        (int(s), float(v)) for s, v in zip(steps[should_prune], sparsity[should_prune])
    ]
