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
from experiments.common import latency
from experiments.common.structured import maskfit_arm as structured_maskfit
from experiments.common.structured.config import StructuredConfig
from experiments.structured_pruning import report

__all__ = ["Config", "run"]


@dataclasses.dataclass(frozen=True)
class Config(StructuredConfig):
    """What to run; the defaults finish in about 10 minutes on 2 cores.

    The fields of `StructuredConfig`, and:

    Attributes:
      run_eagerly: Train eagerly (no tracing; for tiny runs only).
    """

    run_eagerly: bool = False


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
        data = config.load(name)
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
