"""Training and evaluation in PyTorch on `experiments.common.structured.train`'s budget.

Needs `torch`. `Trainer` trains a `torch_models` network on the same batches,
in the same order, with the same optimizer as `structured_train.keras_fit`;
a callback before each step (`before_step`) lets a pruner act at the steps
of `structured_train.pruning_steps`. When the pruner replaces parameters
(Torch-Pruning makes new, smaller ones), `reset_optimizer` makes a new
optimizer over them, as Torch-Pruning's examples do: its state (Adam's
moments, momentum) starts again from zero.
"""

import time

import numpy as np
import torch
from torch import nn

from experiments.common.structured import train as structured_train

__all__ = ["Trainer", "evaluate", "torch_optimizer"]


def torch_optimizer(budget, parameters):
    """A new PyTorch optimizer of `budget` (the same algorithm as `keras_optimizer`)."""
    if budget.optimizer == "adam":
        return torch.optim.Adam(
            parameters, lr=budget.learning_rate, eps=structured_train.ADAM_EPSILON
        )
    return torch.optim.SGD(
        parameters, lr=budget.learning_rate, momentum=structured_train.SGD_MOMENTUM
    )


class Trainer:
    """Trains one model on one seed's batches of `data`, epoch range by epoch range.

    `step` is the global step the model is at (the number of steps a
    continued run has already taken), which `before_step` receives.

    Attributes:
      model: the `torch.nn.Module` trained.
      step: global steps done so far.
      step_seconds: wall seconds of each step's forward, backward and update
        (not of `before_step`).
    """

    def __init__(self, model, data, budget, seed, step=0):
        self.model = model
        self.budget = budget
        self.seed = seed
        self.x = torch.from_numpy(np.ascontiguousarray(data.x_train))
        self.y = torch.from_numpy(data.y_train.astype(np.int64))
        self.step = step
        self.step_seconds = []
        self.loss = nn.CrossEntropyLoss()
        self.reset_optimizer()

    def reset_optimizer(self):
        """A new optimizer over the model's current parameters (state from zero)."""
        self.optimizer = torch_optimizer(self.budget, self.model.parameters())

    def fit(self, first_epoch, last_epoch, before_step=None):
        """Trains epochs `[first_epoch, last_epoch)`; `before_step(step)` runs before each."""
        order = structured_train.batches(
            len(self.x), self.budget, self.seed, first_epoch, last_epoch
        )
        self.model.train()
        for indices in order:
            if before_step is not None:
                before_step(self.step)
            start = time.perf_counter()
            index = torch.from_numpy(indices)
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss(self.model(self.x[index]), self.y[index])
            loss.backward()
            self.optimizer.step()
            self.step_seconds.append(time.perf_counter() - start)
            self.step += 1


def evaluate(model, x, y, batch_size=512):
    """Accuracy of `model`'s logits on NumPy `(x, y)`, in eval mode."""
    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            logits = model(
                torch.from_numpy(np.ascontiguousarray(x[start : start + batch_size]))
            )
            correct += int(
                (logits.argmax(-1).numpy() == y[start : start + batch_size]).sum()
            )
    return correct / len(x)
