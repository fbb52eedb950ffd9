"""The structured-pruning experiment: Config and `run(config, workdir)`.

For each data set (`experiments.common.datasets`: digits, MNIST-1D) and network
(`experiments.common.structured.models`: the MLP and ResNet-8 of issue 23), and
each seed, `experiments.common.structured.maskfit_arm.run_arm` trains the network dense,
prunes each fraction of every unit group gradually with
`maskfit.pruning.prune_units` (magnitude, `round_to`), fine-tunes and shrinks
it; the shrunk models' parameters and MACs are counted
(`experiments.common.model_cost`) and their latency measured against the dense
model's (`experiments.common.latency`: compiled inference, batch 1 and 64,
interleaved rounds). `experiments.structured_pruning.report` writes the
table and the figure.
"""

import dataclasses
import os
import time

import keras
import tensorflow as tf

from experiments import common
from experiments.common import datasets, latency
from experiments.common.structured import maskfit_arm as structured_maskfit
from experiments.common.structured import train as structured_train
from experiments.common.structured import widths as structured_widths
from experiments.structured_pruning import report

__all__ = ["Config", "run"]


@dataclasses.dataclass(frozen=True)
class Config(structured_train.Settings):
    """What to run; the defaults finish in about 10 minutes on 2 cores.

    Attributes:
      datasets: "digits", "mnist1d".
      architectures: "mlp", "resnet".
      fractions: fractions of every unit group pruned, each in (0, 1).
      seeds: distinct seeds; each trains its own dense network.
      optimizer ... finetune_epochs: the `structured_train.Budget`.
      importance_p: magnitude importance `|w|^p`, 1 or 2.
      round_to: every group keeps a multiple of this many units.
      mlp_hidden, resnet_widths, resnet_blocks: the dense networks.
      latency_batches, latency_rounds, round_seconds: the timing.
      keras_path: the inference path timed (`latency.KERAS_PATHS`).
      jit_compile: train with XLA.
      run_eagerly: train eagerly (no tracing: quicker for tiny runs only).
      threads: TensorFlow's `(intra_op, inter_op)` threads; (0, 0) leaves
        its defaults. One by default: on a shared machine a second thread
        waits whenever the other is descheduled, and the timings spread.
      max_train_examples: keep this many training examples (0: all).
    """

    datasets: tuple = ("digits", "mnist1d")
    architectures: tuple = ("mlp", "resnet")
    fractions: tuple = (0.25, 0.5, 0.75)
    seeds: tuple = (0, 1)
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    batch_size: int = 64
    epochs: int = 4
    prune_epochs: int = 1
    prune_steps: int = 3
    finetune_epochs: int = 2
    importance_p: int = 2
    round_to: int = 8
    mlp_hidden: tuple = (1024, 1024)
    resnet_widths: tuple = (32, 64, 128)
    resnet_blocks: int = 1
    latency_batches: tuple = (1, 64)
    latency_rounds: int = 10
    round_seconds: float = 0.05
    # LiteRT: a call costs microseconds, so the times are the model's; a
    # `tf.function` call costs ~0.2-0.5 ms on a 2-core CPU whatever the
    # widths (docs/structured_pruning.md, "Latency: how it is measured").
    keras_path: str = "tflite"
    jit_compile: bool = False
    run_eagerly: bool = False
    threads: tuple = (1, 1)
    max_train_examples: int = 0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if isinstance(getattr(self, field.name), list):
                object.__setattr__(self, field.name, tuple(getattr(self, field.name)))
        _check_names("datasets", self.datasets, datasets.NAMES)
        _check_names("architectures", self.architectures, ("mlp", "resnet"))
        if not self.fractions or any(not 0 < f < 1 for f in self.fractions):
            raise ValueError(
                "Received an invalid value for `fractions`, expected fractions in"
                f" (0, 1). Received: fractions={self.fractions!r}"
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
        _ = self.budget  # Checks the training budget.
        for kind in self.architectures:
            for name in self.datasets:
                for fraction in self.fractions:
                    structured_widths.shrunk(
                        self.architecture(kind, name), fraction, self.round_to
                    )


def _check_names(field, values, known):
    if not values or any(v not in known for v in values):
        raise ValueError(
            f"Received an invalid value for `{field}`, expected some of"
            f" {tuple(known)}. Received: {field}={values!r}"
        )


def _load(config, name):
    data = datasets.load(name)
    if config.max_train_examples:
        keep = config.max_train_examples
        data = dataclasses.replace(
            data, x_train=data.x_train[:keep], y_train=data.y_train[:keep]
        )
    return data


def _machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                "",
            )
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "threads": [
            tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads(),
        ],
    }


def run(config, workdir):
    """Runs the experiment; writes its files under `workdir` and returns the metrics.

    Writes `config.json`, `metrics.json` (machine, every run, the latency
    rows, the summary per fraction, the seconds the run took),
    `structured_pruning.md` (the table) and `structured_pruning.png`
    (accuracy against latency, with the Pareto front).

    Example (tiny; the defaults take about 10 minutes):

    >>> config = Config(datasets=("digits",), architectures=("mlp",),
    ...                 fractions=(0.5,), seeds=(0,), mlp_hidden=(16,),
    ...                 epochs=1, prune_epochs=1, prune_steps=1, finetune_epochs=0,
    ...                 latency_batches=(1,), latency_rounds=1, threads=(0, 0))
    >>> metrics = run(config, "/tmp/structured_pruning_doctest")
    >>> metrics["summary"][1]["params"]
    610
    """
    start = time.perf_counter()
    if any(config.threads):
        latency.set_tensorflow_threads(*config.threads)
    os.makedirs(workdir, exist_ok=True)
    common.write_json(os.path.join(workdir, "config.json"), dataclasses.asdict(config))
    load_before = list(os.getloadavg())
    runs, latency_rows = [], []
    for name in config.datasets:
        data = _load(config, name)
        for kind in config.architectures:
            arch = config.architecture(kind, name)
            arm_runs, arm_latency = structured_maskfit.run_arm(
                arch, data, config.fractions, config.budget, config.seeds, config
            )
            where = {"dataset": name, "architecture": kind}
            runs.extend(dict(r, **where) for r in arm_runs)
            latency_rows.extend(dict(r, **where) for r in arm_latency)
    metrics = {
        "machine": dict(_machine(), load_average_before=load_before),
        "runs": runs,
        "latency": latency_rows,
        "summary": report.summarize(runs, latency_rows),
        "seconds": time.perf_counter() - start,
    }
    common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    with open(os.path.join(workdir, "structured_pruning.md"), "w") as f:
        f.write(report.format_table(metrics))
    report.plot(
        metrics["summary"],
        os.path.join(workdir, "structured_pruning.png"),
        keras_path=config.keras_path,
    )
    return metrics
