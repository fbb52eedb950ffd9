"""The sparse training experiment as a library: `Config` and `run(config, workdir)`.

Dense training, static random sparsity, SET, RigL and gradual magnitude
pruning at equal step budgets (Evci et al., "Rigging the Lottery", ICML
2020, compare them so), on MNIST-1D (an MLP and its small 1-D CNN) and on
scikit-learn's digits (an MLP), at several sparsities and seeds. Every sparse
method trains the same number of weights per layer (the config's sparsity
distribution, ERK by default); static, SET and RigL start from the same
random mask of a seed, and every method of a seed from the same weights and
batches. Each training reports its final test accuracy.
"""

import dataclasses
import math
import os
import time

import tensorflow as tf
from absl import logging

from experiments import common
from experiments.common import datasets, training
from experiments.sparse_training import report, train

__all__ = ["Config", "run"]


@dataclasses.dataclass(frozen=True)
class Config:
    """One run; the defaults finish in about 15 minutes on 2 cores with 5 methods.

    Every (task, method, sparsity, seed) trains a fresh model for
    `train_steps` steps of `batch_size` examples; "dense" trains once per
    task and seed. SET and RigL update every `delta_t` steps until
    `t_end_fraction` of training (RigL's 75%), dropping `alpha` of each
    layer's active weights at first, annealed by `drop_fraction_anneal`;
    pruning rises from 0 to the target between `prune_begin_fraction` and
    `prune_end_fraction` of training, every `delta_t` steps. Test accuracy is
    taken every `eval_every` steps; `train_steps` must be a multiple of it.

    Attributes:
      tasks: '<data set>/<model>' pairs.
      methods: Methods: dense, static, set, rigl, pruning.
      sparsities: Target sparsities.
      seeds: Seeds.
      train_steps: Steps of every training.
      batch_size: Examples per step.
      optimizer: A keras.optimizers name, in any case (`common.OPTIMIZERS`).
      learning_rate: Learning rate.
      eval_every: Steps between test evaluations.
      steps_per_execution: Steps per compiled call.
      mlp_units: MLP widths.
      cnn_filters: CNN channels per layer.
      sparsity_distribution: uniform, erdos_renyi or erdos_renyi_kernel (ERK).
      dense_first_layer: Keep the first layer dense.
      delta_t: Steps between mask updates.
      alpha: Initial drop fraction of SET and RigL.
      drop_fraction_anneal: cosine or constant.
      t_end_fraction: Share of training with mask updates.
      prune_begin_fraction: Pruning starts here.
      prune_end_fraction: Pruning ends here.
      jit_compile: Compile the step with XLA.
      numpy_weights: Draw the initial kernels with NumPy (Glorot-uniform, the
        layers' own initializer) instead of Keras's seeded initializer, whose
        numbers differ per backend: a seed then starts from the same weights
        under TensorFlow and JAX.
    """

    tasks: tuple = ("mnist1d/mlp", "mnist1d/cnn", "digits/mlp")
    methods: tuple = train.METHODS
    sparsities: tuple = (0.8, 0.9, 0.95)
    seeds: tuple = (0, 1, 2)
    train_steps: int = 3000
    batch_size: int = 100
    optimizer: str = "adam"
    learning_rate: float = 5e-3
    eval_every: int = 500
    steps_per_execution: int = 100
    mlp_units: tuple = (100, 100)
    cnn_filters: tuple = (25, 25, 25)
    sparsity_distribution: str = "erdos_renyi_kernel"
    dense_first_layer: bool = False
    delta_t: int = 100
    alpha: float = 0.3
    drop_fraction_anneal: str = "cosine"
    t_end_fraction: float = 0.75
    prune_begin_fraction: float = 0.1
    prune_end_fraction: float = 0.75
    jit_compile: bool = False
    numpy_weights: bool = False

    def __post_init__(self):
        for name in (
            "tasks",
            "methods",
            "sparsities",
            "seeds",
            "mlp_units",
            "cnn_filters",
        ):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected a non-empty"
                    f" tuple. Received: {name}={value!r}"
                )
        self._check_choices()
        for name in (
            "train_steps",
            "batch_size",
            "eval_every",
            "steps_per_execution",
            "delta_t",
        ):
            common.check_int(name, getattr(self, name), minimum=1)
        for name in ("mlp_units", "cnn_filters"):
            for item in getattr(self, name):
                common.check_int(name, item, minimum=1, received=getattr(self, name))
        for item in self.seeds:
            common.check_int("seeds", item, minimum=0, received=self.seeds)
        training.check_distinct_seeds(self.seeds)
        if self.train_steps % self.eval_every:
            raise ValueError(
                "Received an invalid value for `eval_every`, expected a divisor of"
                f" train_steps={self.train_steps}. Received:"
                f" eval_every={self.eval_every!r}"
            )
        for item in self.sparsities:
            common.check_fraction("sparsities", item, received=self.sparsities)
        for name in (
            "alpha",
            "t_end_fraction",
            "prune_begin_fraction",
            "prune_end_fraction",
        ):
            common.check_fraction(name, getattr(self, name), closed=True)
        if self.prune_begin_fraction >= self.prune_end_fraction:
            raise ValueError(
                "Received invalid values for `prune_begin_fraction` and"
                " `prune_end_fraction`, expected begin < end. Received:"
                f" prune_begin_fraction={self.prune_begin_fraction!r},"
                f" prune_end_fraction={self.prune_end_fraction!r}"
            )
        common.check_fraction("learning_rate", self.learning_rate, upper=math.inf)
        common.check_optimizer(self.optimizer)
        for name in ("dense_first_layer", "numpy_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected True or"
                    f" False. Received: {name}={getattr(self, name)!r}"
                )
        # The rules' own checks (distribution, anneal, schedule), up front.
        train.dynamic_rule("set", self.sparsities[0], self, 0)
        if int(self.prune_end_fraction * self.train_steps) <= int(
            self.prune_begin_fraction * self.train_steps
        ):
            raise ValueError(
                "Received an invalid value for `train_steps`, expected enough steps"
                " for pruning to begin before it ends. Received:"
                f" train_steps={self.train_steps!r}"
            )

    def _check_choices(self):
        for task in self.tasks:
            data, _, model = str(task).partition("/")
            if data not in datasets.NAMES or model not in train.MODELS:
                raise ValueError(
                    "Received an invalid value for `tasks`, expected"
                    " '<data set>/<model>' with a data set in"
                    f" {datasets.NAMES} and a model in {train.MODELS}."
                    f" Received: tasks={self.tasks!r}"
                )
        for method in self.methods:
            if method not in train.METHODS:
                raise ValueError(
                    f"Received an invalid value for `methods`, expected names from"
                    f" {train.METHODS}. Received: methods={self.methods!r}"
                )
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(
                "Received an invalid value for `methods`, expected distinct names."
                f" Received: methods={self.methods!r}"
            )


def _trainings(config):
    """(task, method, sparsity) of every training of one seed; dense once per task."""
    for task in config.tasks:
        for method in config.methods:
            for sparsity in (0.0,) if method == "dense" else config.sparsities:
                yield task, method, sparsity


def run(config, workdir, callbacks_for=None):
    """Runs every training of `config`, writing everything in `workdir`.

    Args:
      config: a `Config`.
      workdir: directory for `config.json`, `metrics.json`, `table.md`,
        `sparse_training.png` (with matplotlib) and TensorBoard events under
        `tensorboard/<task>/<method>`; created if missing.
      callbacks_for: optional `callbacks_for(task, method, sparsity, seed)`
        returning extra Keras callbacks for that training.

    Returns:
      The metrics dict also written to `metrics.json`: `results` (a list of
      one dict per training), `summary` (per task, method and sparsity: the
      test accuracy's mean, std, min, max and values over seeds), the data
      sizes, and `wall_seconds`.
    """
    start = time.perf_counter()
    data = {
        name: train.load_data(name) for name in {t.split("/")[0] for t in config.tasks}
    }
    os.makedirs(workdir, exist_ok=True)
    common.write_json(os.path.join(workdir, "config.json"), dataclasses.asdict(config))
    extra = callbacks_for or (lambda task, method, sparsity, seed: [])
    results, writers = [], {}
    # Every training builds and traces a fresh model, by design (fresh masks,
    # rules and optimizer state): TensorFlow's warning about retracing is noise.
    tf_logger, level = tf.get_logger(), tf.get_logger().level
    tf_logger.setLevel("ERROR")
    try:
        for seed in config.seeds:
            for task, method, sparsity in _trainings(config):
                result = train.train(
                    task,
                    method,
                    sparsity,
                    seed,
                    data[task.split("/")[0]],
                    config,
                    extra(task, method, sparsity, seed),
                )
                result.update(task=task, method=method, sparsity=sparsity, seed=seed)
                results.append(result)
                logging.info(
                    "%s %s sparsity %.2f seed %d: test accuracy %.4f, kernel density"
                    " %.4f, %.1f s",
                    task,
                    method,
                    sparsity,
                    seed,
                    result["test_accuracy"],
                    result["kernel_density"]["all"],
                    result["seconds"],
                )
                key = (task, method)
                if key not in writers:
                    writers[key] = tf.summary.create_file_writer(
                        os.path.join(workdir, "tensorboard", task, method)
                    )
                report.write_curve(writers[key], result)
        summary = report.summarize(results)
        for (task, method), writer in writers.items():
            report.write_summary(writer, summary[task][method])
    finally:
        tf_logger.setLevel(level)
        for writer in writers.values():
            writer.close()
    metrics = {
        "data": {
            name: {"train": len(d.x_train), "test": len(d.x_test)}
            for name, d in data.items()
        },
        "results": results,
        "summary": summary,
        "wall_seconds": time.perf_counter() - start,
    }
    common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    table = report.table(summary, config)
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table)
    report.figure(summary, config, os.path.join(workdir, "sparse_training.png"))
    logging.info(
        "%d trainings in %.1f s\n%s", len(results), metrics["wall_seconds"], table
    )
    return metrics
