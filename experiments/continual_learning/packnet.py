"""PackNet (Mallya & Lazebnik, CVPR 2018) on maskfit's exact masks.

One network learns the tasks in turn. Every kernel entry has an owner: free
(0) or the task that kept it (t + 1 for task t). Task t:

1. **Train** `epochs` on the task. Learnable: the free entries (and, with a
   head per task, the task's own head columns). Entries owned by earlier
   tasks are frozen by `maskfit.ElementMask`, so they stay bit-identical
   under Adam's moments, momentum or AdamW's weight decay.
2. **Prune** each packed layer on the host: of the entries the task just
   trained, keep the `1 - prune_fraction` of largest magnitude (task t owns
   them now); the others are set to +0 and stay free.
3. **Retrain** `retrain_epochs` with only task t's entries learnable; the
   pruned ones are frozen at +0, so they are still exactly 0 when the next
   task starts training them.

Task t's inference uses the kernel entries owned by tasks 0..t: the forward
pass reads the others (later tasks' and free ones) as 0, through
`Network.task_logits`'s `keep` (a `keras.StatelessScope` mapping, not a copy
of the weights), so an earlier task's logits do not change while later tasks
learn, bit for bit.

Biases are trained on the first task and then frozen, as the paper does (it
also freezes batch-norm parameters): a bias is shared by every task that
uses its unit, and per-task biases would be state the paper does not have.
With a head per task, each task's head (kernel columns and biases) is its
own from the start, trained in its task only and never pruned, as the
paper's per-task classifiers; a shared head is packed like the hidden
layers.
"""

import numpy as np

import maskfit
from experiments.continual_learning import methods

__all__ = ["FREE", "PackNet"]

# The owner of an entry no task has kept yet.
FREE = 0


class PackNet(methods.TaskTraining):
    """PackNet on one `Network`: ownership, masks, pruning and inference.

    Attributes:
      network: the `net.Network` it trains.
      owners: {layer name: int array of the kernel's shape}: `FREE` or the
        task index + 1 of the task that owns the entry.
    """

    name = "packnet"

    def __init__(self, network, settings, seed, epochs, retrain_epochs, prune_fraction):
        self.network = network
        self.networks = [network]
        self._seed = seed
        self._settings = settings
        self._epochs = epochs
        self._retrain_epochs = retrain_epochs
        self._prune_fraction = prune_fraction
        self.owners = {}
        for layer in network.layers:
            owners = np.full(layer.kernel.shape, FREE, np.int32)
            if self._head_per_task(layer):
                # Each head's columns belong to its task from the start.
                for head in range(network.heads):
                    owners[:, network.head_columns(head)] = head + 1
            self.owners[layer.name] = owners

    def _head_per_task(self, layer):
        return layer is self.network.layers[-1] and self.network.heads > 1

    def _packed(self, layer):
        """Whether the layer's kernel is pruned and shared out between tasks."""
        return not self._head_per_task(layer)

    def _set_masks(self, task, learnable):
        """Declares the masks: `learnable[name]` for kernels; biases as documented."""
        for layer in self.network.layers:
            if self._head_per_task(layer):
                bias = self.network.head_columns(task)
            else:
                bias = np.full(layer.bias.shape, task == 0)
            self._declare(layer, learnable[layer.name], bias)

    def _declare(self, layer, kernel, bias):
        """Declares 0/1 `kernel` and `bias` masks on the layer: maskfit's masks."""
        spec = maskfit.ElementMask({"kernel": kernel, "bias": bias})
        maskfit.set_mask(layer, spec)

    def learn(self, task_index, task):
        """Trains, prunes and retrains the network on `task` (the `task_index`-th).

        Raises:
          ValueError: with a head per task, if the task's head is not its index
            (the head's columns are owned by the task of that index).
        """
        if self.network.heads > 1 and task.head != task_index:
            raise ValueError(
                f"With a head per task, task {task_index} must answer with head"
                f" {task_index}. Received: task {task.name!r} with head={task.head}"
            )
        owner = task_index + 1
        train = {n: (o == FREE) | (o == owner) for n, o in self.owners.items()}
        self._set_masks(task_index, train)
        self.train_task(task_index, task)
        self._prune(owner)
        self._set_masks(task_index, {n: o == owner for n, o in self.owners.items()})
        self.train_task(task_index, task, self._retrain_epochs, phase=1)

    def _prune(self, owner):
        """Gives `owner` the largest-magnitude free entries of each packed layer."""
        for layer in self.network.layers:
            owners = self.owners[layer.name]
            if not self._packed(layer):
                continue
            kernel = layer.kernel.numpy()
            free = np.flatnonzero(owners == FREE)
            keep = int(round((1 - self._prune_fraction) * free.size))
            # Largest |w| first; among equal magnitudes, the lower index.
            order = np.argsort(-np.abs(kernel.ravel()[free]), kind="stable")
            np.put(owners, free[order[:keep]], owner)
            kernel[owners == FREE] = 0.0
            layer.kernel.assign(kernel)

    def inference_masks(self, task_index):
        """Per layer, the kernel entries task `task_index`'s forward pass uses."""
        return [
            (self.owners[l.name] != FREE) & (self.owners[l.name] <= task_index + 1)
            for l in self.network.layers
        ]

    def logits(self, task_index, task, x):
        """Task `task_index`'s logits: its head, with the weights of tasks <= it."""
        return self.network.task_logits(
            self._settings, x, task.head, self.inference_masks(task_index)
        )

    def capacity(self, tasks):
        """{layer name: {"per_task": [share of the kernel owned by task t], "free"}}.

        Args:
          tasks: how many tasks to report (those learned so far). With a head
            per task, each task owns its head's columns from the start.
        """
        return {
            name: {
                "per_task": [float(np.mean(owners == t + 1)) for t in range(tasks)],
                "free": float(np.mean(owners == FREE)),
            }
            for name, owners in self.owners.items()
        }
