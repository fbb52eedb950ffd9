"""Torch-Pruning's iterative steps as a maskfit pruning schedule.

Torch-Pruning's `MetaPruner(iterative_steps=N, pruning_ratio=f)` prunes, at
its k-th `step()` (k = 1..N), to the fraction `f * k / N` of every group;
`experiments.common.structured.train.pruning_steps` says before which training
steps (0-based) the arms call it. `StepSchedule` is that list as a maskfit
`PruningSchedule`, and `budget_schedule` builds it from a `Budget`, so a
`maskfit.pruning.prune_units` run removes its units at the same steps, to the
same fractions, as Torch-Pruning does.

maskfit counts training steps as TF-MOT does (the n-th batch, 1-based: the
optimizer's `iterations + 1`, see `maskfit.pruning.UnitPruning`), and prunes
in that step before the forward pass: Torch-Pruning's step before the
0-based update `p` is maskfit's step `p + 1`.
"""

import keras
import numpy as np
import tensorflow as tf

import maskfit
from experiments.common.structured import train as structured_train

__all__ = ["StepSchedule", "budget_schedule"]


@keras.saving.register_keras_serializable(package="experiments")
class StepSchedule(maskfit.pruning.PruningSchedule):
    """Prunes at the listed steps only, each to its own sparsity.

    Args:
      steps: strictly increasing training steps (1-based, as maskfit counts).
      sparsities: the sparsity (fraction of units removed) at each step,
        non-decreasing, each in [0, 1).

    Raises:
      ValueError: for steps that are not increasing positive integers,
        sparsities out of range or decreasing, or lists of different lengths.

    Example:

    >>> schedule = StepSchedule([5, 7], [0.25, 0.5])
    >>> maskfit.pruning.pruning_steps(schedule, 0, 10)
    [(5, 0.25), (7, 0.5)]
    """

    def __init__(self, steps, sparsities):
        steps, sparsities = list(steps), list(sparsities)
        if not steps or len(steps) != len(sparsities):
            raise ValueError(
                "StepSchedule needs as many sparsities as steps, at least one."
                f" Received: steps={steps!r}, sparsities={sparsities!r}"
            )
        for step in steps:
            self._validate_step(step, step, 1, allow_negative_1=False)
        if any(b <= a for a, b in zip(steps, steps[1:])) or steps[0] < 1:
            raise ValueError(
                "StepSchedule steps must be increasing and >= 1 (maskfit's steps"
                f" are 1-based). Received: steps={steps!r}"
            )
        for sparsity in sparsities:
            self._validate_sparsity(sparsity, "sparsities")
        if any(b < a for a, b in zip(sparsities, sparsities[1:])):
            raise ValueError(
                "StepSchedule sparsities must not decrease (removed units stay"
                f" removed). Received: sparsities={sparsities!r}"
            )
        self.steps = [int(s) for s in steps]
        self.sparsities = [float(s) for s in sparsities]

    def __call__(self, step):
        step = tf.cast(tf.convert_to_tensor(step), tf.int64)
        hits = tf.equal(tf.constant(self.steps, tf.int64), step)
        # The sparsity of the listed step, or the last one passed (0 before).
        passed = tf.reduce_sum(
            tf.cast(tf.constant(self.steps, tf.int64) <= step, tf.int32)
        )
        table = tf.constant([0.0] + self.sparsities, tf.float32)
        return tf.reduce_any(hits), tf.gather(table, passed)

    def last_pruning_step(self):
        return self.steps[-1]

    def get_config(self):
        return {"steps": list(self.steps), "sparsities": list(self.sparsities)}


def budget_schedule(examples, budget, fraction):
    """The `StepSchedule` of `budget`'s pruning steps, to `fraction` at the end.

    Step k (1..N) of `budget.prune_steps` prunes to `fraction * k / N` at
    maskfit step `structured_train.pruning_steps(...)[k - 1] + 1`.

    Example:

    >>> budget = structured_train.Budget(batch_size=64, epochs=2, prune_epochs=1,
    ...                                  prune_steps=2)
    >>> budget_schedule(640, budget, 0.5).get_config()
    {'steps': [21, 26], 'sparsities': [0.25, 0.5]}
    """
    steps = structured_train.pruning_steps(examples, budget)
    count = budget.prune_steps
    sparsities = (fraction * np.arange(1, count + 1) / count).tolist()
    sparsities[-1] = float(fraction)  # Exactly the target, whatever the rounding.
    return StepSchedule([s + 1 for s in steps], sparsities)
