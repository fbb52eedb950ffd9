"""The continual learning experiment as a library: `Config` and `run(config, workdir)`.

PackNet (Mallya & Lazebnik, CVPR 2018) next to fine-tuning, separate
networks and EWC, on task sequences that need no download
(`tasks`). For each sequence, seed and method, one
learner learns the tasks in turn; after each task it is tested on every task
seen so far, which gives the accuracy matrix R[i][j] (the accuracy on task j
after learning task i), the average accuracy after each task and the
backward transfer BWT = mean over j < T-1 of R[T-1][j] - R[j][j] (Lopez-Paz &
Ranzato, 2017; negative is forgetting). Each task's test logits right after
it was learned are compared with its logits after the last task, bit for bit.
"""

import dataclasses
import functools
import math
import numbers
import os
import time

import keras
import numpy as np
from absl import logging

from experiments import common
from experiments.common import training
from experiments.continual_learning import ewc, gradmask, methods, net, packnet, report
from experiments.continual_learning import tasks as tasks_lib

__all__ = ["METHODS", "Config", "learn_sequence", "make_method", "run"]

# "packnet_gradmask" is the control: PackNet with hand-written gradient masks.
METHODS = ("packnet", "finetune", "separate", "ewc", "packnet_gradmask")


@dataclasses.dataclass(frozen=True)
class Config:
    """One run: the sequences, the methods, the network and its training.

    Every method trains each task `epochs` passes with a fresh optimizer
    (`optimizer`, `learning_rate`, `weight_decay`: None for the optimizer's
    default) in batches of `batch_size`; PackNet then prunes
    `prune_fraction` of the weights the task trained in each layer and
    retrains the rest `retrain_epochs` passes. EWC's penalty has the
    strength `ewc_strength` and its Fisher information comes from
    `ewc_samples` training examples of each task. `mnist1d_samples` (None:
    the package's 5,000) generates a smaller MNIST-1D for quick runs.

    Attributes:
      sequences: Task sequences, among split_digits, split_mnist1d, permuted_digits,
        permuted_mnist1d (`tasks.NAMES`).
      permuted_tasks: Tasks of a permuted sequence.
      methods: Methods, among packnet, finetune, separate, ewc, packnet_gradmask
        (`METHODS`; PackNet with hand-written gradient masks instead of maskfit's: the
        control).
      hidden_units: Units of each hidden layer.
      optimizer: A keras.optimizers name, in any case (`common.OPTIMIZERS`).
      learning_rate: Learning rate.
      weight_decay: The optimizer's weight_decay (unset: the optimizer's default).
      batch_size: Examples per step.
      epochs: Passes over each task.
      retrain_epochs: PackNet: passes over each task after pruning, training its
        survivors.
      prune_fraction: PackNet: fraction of the weights a task trained that are freed for
        later tasks, per layer.
      ewc_strength: EWC: the penalty's strength (lambda).
      ewc_samples: EWC: training examples per task for the Fisher information.
      seeds: Seeds.
      mnist1d_samples: Generate this many MNIST-1D examples instead of 5,000 (quick
        runs).
      steps_per_execution: Training steps per call of the compiled step.
      jit_compile: Compile with XLA.
      numpy_weights: Draw the initial kernels with NumPy (Glorot-uniform, as the
        layers' seeded initializer) instead of Keras, whose numbers differ per
        backend: a seed then starts from the same weights under TensorFlow and JAX.
    """

    sequences: tuple = ("split_mnist1d", "permuted_mnist1d")
    permuted_tasks: int = 5
    methods: tuple = ("packnet", "finetune", "separate", "ewc")
    hidden_units: tuple = (256, 256)
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    weight_decay: float = None
    batch_size: int = 64
    epochs: int = 10
    retrain_epochs: int = 5
    prune_fraction: float = 0.75
    ewc_strength: float = 10.0
    ewc_samples: int = 500
    seeds: tuple = (0, 1, 2)
    mnist1d_samples: int = None
    steps_per_execution: int = 10
    jit_compile: bool = False
    numpy_weights: bool = False

    def __post_init__(self):
        for name in ("sequences", "methods", "hidden_units", "seeds"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for name, known in (("sequences", tasks_lib.NAMES), ("methods", METHODS)):
            value = getattr(self, name)
            if (
                not isinstance(value, tuple)
                or not value
                or len(set(value)) != len(value)
                or not set(value) <= set(known)
            ):
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected distinct"
                    f" names among {', '.join(known)}. Received: {name}={value!r}"
                )
        if (
            "packnet_gradmask" in self.methods
            and keras.backend.backend() != "tensorflow"
        ):
            raise ValueError(
                "The control `packnet_gradmask` (a `train_step` with a gradient"
                " tape) runs on TensorFlow only; received it in `methods` under"
                f" KERAS_BACKEND={keras.backend.backend()}. Run it with"
                " KERAS_BACKEND=tensorflow, or leave it out of `methods`."
            )
        for name, minimum in (("hidden_units", 1), ("seeds", 0)):
            training.check_int_tuple(name, getattr(self, name), minimum, _check_int)
        training.check_distinct_seeds(self.seeds)
        for name in ("batch_size", "epochs", "ewc_samples", "steps_per_execution"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("permuted_tasks", self.permuted_tasks, minimum=2)
        _check_int("retrain_epochs", self.retrain_epochs, minimum=0)
        if self.mnist1d_samples is not None:
            _check_int("mnist1d_samples", self.mnist1d_samples, minimum=100)
        _check_number("learning_rate", self.learning_rate, "a positive number", 0)
        _check_number("ewc_strength", self.ewc_strength, "a non-negative number")
        if self.weight_decay is not None:
            _check_number("weight_decay", self.weight_decay, "None or a number >= 0")
        _check_number(
            "prune_fraction", self.prune_fraction, "a number in (0, 1)", 0, upper=1
        )
        for name in ("jit_compile", "numpy_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected a bool."
                    f" Received: {name}={getattr(self, name)!r}"
                )
        common.check_optimizer(self.optimizer)

    def settings(self):
        """The `TrainSettings` every method trains with."""
        return net.TrainSettings(
            optimizer=self.optimizer,
            learning_rate=self.learning_rate,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            compile_kwargs=dict(
                steps_per_execution=self.steps_per_execution,
                jit_compile=common.compiled_step(self.jit_compile),
            ),
        )


def _check_int(name, value, minimum, received=None):
    """Raises unless `value` is an integer >= `minimum` (an item of `received`)."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Integral)
    if not (ok and value >= minimum):
        expected = f"integers >= {minimum}" if received else f"an integer >= {minimum}"
        raise ValueError(
            f"Received an invalid value for `{name}`, expected {expected}."
            f" Received: {name}={value if received is None else received!r}"
        )


def _check_number(name, value, expected, lower=None, upper=math.inf):
    """Raises unless `value` is a finite real in [0, upper) (in (lower, upper))."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and value < upper
    ok = ok and (value > lower if lower is not None else value >= 0)
    if not ok:
        raise ValueError(
            f"Received an invalid value for `{name}`, expected {expected}."
            f" Received: {name}={value!r}"
        )


def make_method(name, sequence, config, seed):
    """Builds method `name`'s learner for `sequence`, with fresh networks.

    Args:
      name: one of `METHODS`.
      sequence: the `tasks.Sequence` it will learn.
      config: the `Config` (network, training, method settings).
      seed: draws the initial weights (the same for PackNet, its control,
        fine-tuning and EWC; each separate network its own), the batch order
        of each task (the same for every method) and EWC's samples.

    Returns:
      A learner with `learn(task_index, task)`, `logits(task_index, task, x)`
      and `networks`.
    """
    settings = config.settings()
    shape = (sequence.features, config.hidden_units)

    def network(model_class=None):
        # PackNet, fine-tuning and EWC start from the same weights.
        return net.Network(
            *shape,
            sequence.heads,
            sequence.classes_per_head,
            [seed, 0],
            model_class,
            config.numpy_weights,
        )

    if name in ("packnet", "packnet_gradmask"):
        if name == "packnet":
            kind, model_class = packnet.PackNet, None
        else:
            kind, model_class = gradmask.HandMaskedPackNet, gradmask.HandMaskedModel
        return kind(
            network(model_class),
            settings,
            seed,
            config.epochs,
            config.retrain_epochs,
            config.prune_fraction,
        )
    if name == "finetune":
        return methods.FineTune(network(), settings, seed, config.epochs)
    if name == "ewc":
        return ewc.EWC(
            network(),
            settings,
            seed,
            config.epochs,
            config.ewc_strength,
            config.ewc_samples,
        )
    units = methods.separate_hidden_units(*shape, sequence, len(sequence.tasks))

    def separate_network(task_index):
        return net.Network(
            sequence.features,
            units,
            1,
            sequence.classes_per_head,
            [seed, 1, task_index],
            numpy_weights=config.numpy_weights,
        )

    return methods.Separate(separate_network, settings, seed, config.epochs)


def _bits_equal(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def learn_sequence(method, sequence, observe=None):
    """Has `method` learn every task of `sequence`, testing after each.

    Args:
      method: a learner (`make_method`).
      sequence: a `tasks.Sequence`.
      observe: optional `observe(task_index, method, logits)`, called after
        each task with the test logits of every task seen so far.

    Raises:
      ValueError: for a sequence of fewer than 2 tasks.

    Returns:
      A dict: `accuracy` (the matrix as nested lists, None above the
      diagonal), `average_accuracy` (after each task), `backward_transfer`,
      `logits_identical` (per earlier task: its logits after the last task
      equal those right after it was learned, bit for bit),
      `max_logit_change`, `parameters` and `seconds` (per task).
    """
    tasks = sequence.tasks
    count = len(tasks)
    if count < 2:
        raise ValueError(
            "Received a sequence of fewer than 2 tasks; backward transfer needs an"
            f" earlier task. Received: {sequence.name!r} with {count} task(s)"
        )
    accuracy = [[None] * count for _ in range(count)]
    learned, seconds = [], []
    for i, task in enumerate(tasks):
        start = time.perf_counter()
        method.learn(i, task)
        seconds.append(time.perf_counter() - start)
        logits = [method.logits(j, tasks[j], tasks[j].x_test) for j in range(i + 1)]
        learned.append(logits[i])
        for j, task_logits in enumerate(logits):
            predicted = np.argmax(task_logits, axis=-1)
            truth = tasks[j].y_test % sequence.classes_per_head
            accuracy[i][j] = float(np.mean(predicted == truth))
        if observe is not None:
            observe(i, method, logits)
    final = logits
    earlier = range(count - 1)
    return {
        "accuracy": accuracy,
        "average_accuracy": [
            float(np.mean(row[: i + 1])) for i, row in enumerate(accuracy)
        ],
        "backward_transfer": float(
            np.mean([accuracy[-1][j] - accuracy[j][j] for j in earlier])
        ),
        "logits_identical": [_bits_equal(final[j], learned[j]) for j in earlier],
        "max_logit_change": [
            float(np.max(np.abs(final[j] - learned[j]))) for j in earlier
        ],
        "parameters": sum(n.model.count_params() for n in method.networks),
        "seconds": seconds,
    }


def run(config, workdir, observe=None):
    """Runs every method on every sequence for every seed, writing under `workdir`.

    Args:
      config: a `Config`.
      workdir: directory for `config.json`, `metrics.json`, `table.md`,
        `continual_learning.png` (when matplotlib is installed) and
        TensorBoard events under `tensorboard/<sequence>/<method>`.
      observe: optional `observe(sequence, seed, method_name, task_index,
        method, logits)` called after each task (tests watch the weights).

    Returns:
      The metrics dict also written to `metrics.json`.

    Raises:
      ImportError: if the data's package (scikit-learn, mnist1d) is
        missing, before anything is written.
    """
    start = time.perf_counter()
    sequences = [
        tasks_lib.load(name, config.permuted_tasks, config.mnist1d_samples)
        for name in config.sequences
    ]
    os.makedirs(workdir, exist_ok=True)
    common.write_json(os.path.join(workdir, "config.json"), dataclasses.asdict(config))
    results = {}
    for sequence in sequences:
        per_seed = results.setdefault(sequence.name, {})
        for seed in config.seeds:
            for name in config.methods:
                watch = None
                if observe is not None:
                    watch = functools.partial(observe, sequence.name, seed, name)
                method = make_method(name, sequence, config, seed)
                result = learn_sequence(method, sequence, watch)
                if name.startswith("packnet"):
                    result["capacity"] = method.capacity(len(sequence.tasks))
                per_seed.setdefault(str(seed), {})[name] = result
                logging.info(
                    "%s seed %d %s: average accuracy %.4f, BWT %+.4f, %.1f s",
                    sequence.name,
                    seed,
                    name,
                    result["average_accuracy"][-1],
                    result["backward_transfer"],
                    sum(result["seconds"]),
                )
    summary = {
        sequence.name: report.summarize(results[sequence.name], config.methods)
        for sequence in sequences
    }
    metrics = {
        "tasks": {
            s.name: [
                {"name": t.name, "train": len(t.x_train), "test": len(t.x_test)}
                for t in s.tasks
            ]
            for s in sequences
        },
        "seeds": results,
        "summary": summary,
        "wall_seconds": time.perf_counter() - start,
    }
    report.write_events(os.path.join(workdir, "tensorboard"), results, summary)
    common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    table = report.tables(summary, metrics["tasks"])
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table)
    report.figure(summary, config, os.path.join(workdir, "continual_learning.png"))
    logging.info("%.1f s\n%s", metrics["wall_seconds"], table)
    return metrics
