"""What every structured-pruning run is configured by: `StructuredConfig`.

`experiments.structured_pruning.lib.Config` (maskfit alone) and
`benchmarks.structured_vs_torch_pruning.lib.Config` (maskfit beside
Torch-Pruning) add their own fields and defaults to it.
"""

import dataclasses
from typing import ClassVar

from experiments.common import datasets, latency
from experiments.common.structured import models, widths
from experiments.common.structured.train import Budget

__all__ = ["StructuredConfig"]


@dataclasses.dataclass(frozen=True)
class StructuredConfig(Budget):
    """The training budget, the grid, the networks and the timing of a run.

    The fields of its `Budget` come first (`budget` is that `Budget` alone).
    Lists become tuples. Subclasses with `unpruned_fraction = True` accept a
    fraction of 0 (the dense network trained on the same total budget).

    Attributes:
      datasets: digits, mnist1d.
      architectures: mlp, resnet.
      fractions: Fractions of every unit group pruned, in (0, 1).
      seeds: Seeds; each trains its own dense network.
      optimizer: adam or sgd (momentum 0.9).
      learning_rate: Constant learning rate.
      batch_size: Examples per step.
      epochs: Dense epochs before pruning.
      prune_epochs: Epochs over which the pruning steps are spread.
      prune_steps: Pruning steps (the fraction grows in equal steps).
      finetune_epochs: Epochs after the pruning epochs.
      importance_p: Magnitude importance |w|^p: 1 or 2 (Torch-Pruning's
        `MagnitudeImportance(p)`: a unit's score sums |w|^p over every weight
        coupled to it).
      round_to: Every group keeps a multiple of this many units.
      mlp_hidden: The MLP's hidden units.
      resnet_widths: The ResNet's channels per stage.
      resnet_blocks: Blocks per stage (1: ResNet-8, 3: ResNet-20).
      latency_batches: Batch sizes timed.
      latency_rounds: Interleaved rounds timed per batch size.
      round_seconds: About how long the dense model runs per round.
      keras_path: Inference path timed: tflite (LiteRT), function, xla,
        predict_on_batch, eager. LiteRT by default: a call costs
        microseconds, so the times are the model's; a `tf.function` call
        costs ~0.2-0.5 ms on a 2-core CPU whatever the widths
        (docs/structured_pruning.md, "Latency: how it is measured").
      jit_compile: Train with XLA.
      threads: TensorFlow's intra_op,inter_op threads (0,0: its defaults).
        One by default: on a shared machine a second thread waits whenever
        the other is descheduled, and the timings spread.
      max_train_examples: Keep this many training examples (0: all).
    """

    unpruned_fraction: ClassVar[bool] = False

    epochs: int = 4
    prune_epochs: int = 1
    prune_steps: int = 3
    finetune_epochs: int = 2
    datasets: tuple = ("digits", "mnist1d")
    architectures: tuple = ("mlp", "resnet")
    fractions: tuple = (0.25, 0.5, 0.75)
    seeds: tuple = (0, 1)
    importance_p: int = 2
    round_to: int = 8
    mlp_hidden: tuple = (1024, 1024)
    resnet_widths: tuple = (32, 64, 128)
    resnet_blocks: int = 1
    latency_batches: tuple = (1, 64)
    latency_rounds: int = 10
    round_seconds: float = 0.05
    keras_path: str = "tflite"
    jit_compile: bool = False
    threads: tuple = (1, 1)
    max_train_examples: int = 0

    def __post_init__(self):
        super().__post_init__()  # Checks the training budget.
        for field in dataclasses.fields(self):
            if isinstance(getattr(self, field.name), list):
                object.__setattr__(self, field.name, tuple(getattr(self, field.name)))
        _check_names("datasets", self.datasets, datasets.NAMES)
        _check_names("architectures", self.architectures, ("mlp", "resnet"))
        interval = "[0, 1)" if self.unpruned_fraction else "(0, 1)"
        if not self.fractions or not all(
            (f >= 0 if self.unpruned_fraction else f > 0) and f < 1
            for f in self.fractions
        ):
            raise ValueError(
                "Received an invalid value for `fractions`, expected fractions in"
                f" {interval}. Received: fractions={self.fractions!r}"
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(
                "Received an invalid value for `seeds`, expected distinct seeds."
                f" Received: seeds={self.seeds!r}"
            )
        if self.importance_p not in (1, 2):
            raise ValueError(
                "Received an invalid value for `importance_p`, expected 1 or 2."
                f" Received: importance_p={self.importance_p!r}"
            )
        if self.keras_path not in latency.KERAS_PATHS:
            raise ValueError(
                f"Received an invalid value for `keras_path`, expected one of"
                f" {latency.KERAS_PATHS}. Received: keras_path={self.keras_path!r}"
            )
        for kind in self.architectures:
            for name in self.datasets:
                arch = self.architecture(kind, name)
                for fraction in self.fractions:
                    if fraction:
                        widths.shrunk(arch, fraction, self.round_to)

    @property
    def budget(self):
        """The `Budget` of every run."""
        return Budget(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(Budget)}
        )

    def architecture(self, kind, dataset):
        """The dense `kind` network for the data set `dataset`."""
        if kind == "mlp":
            return models.for_data(kind, dataset, hidden=self.mlp_hidden)
        return models.for_data(
            kind, dataset, widths=self.resnet_widths, blocks=self.resnet_blocks
        )

    def load(self, name):
        """The data set `name`, its training set cut to `max_train_examples`."""
        data = datasets.load(name)
        if self.max_train_examples:
            keep = self.max_train_examples
            data = dataclasses.replace(
                data, x_train=data.x_train[:keep], y_train=data.y_train[:keep]
            )
        return data


def _check_names(field, values, known):
    if not values or any(v not in known for v in values):
        raise ValueError(
            f"Received an invalid value for `{field}`, expected some of"
            f" {tuple(known)}. Received: {field}={values!r}"
        )
