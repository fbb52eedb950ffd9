r"""Continual learning: PackNet on exact masks, against fine-tuning and others.

Learns Split MNIST-1D (5 tasks of 2 classes, a head per task) and Permuted
MNIST-1D (`--permuted_tasks` tasks of 10 classes, one shared head) task after
task with each method and each of `--seeds`, and reports after each task
the accuracy on every task seen so far, the average accuracy and the
backward transfer. Writes `config.json`, `metrics.json`, `table.md`,
`continual_learning.png` and TensorBoard events under `--workdir`. Needs the
`experiments` extra (mnist1d, scikit-learn; matplotlib for the figure). The
logic is in `continual_learning_lib`.

Usage (docs/continual_learning.md has their results):
  python -m experiments.continual_learning --workdir=/tmp/continual
  python -m experiments.continual_learning --sequences=permuted_mnist1d \
      --permuted_tasks=10 --prune_fraction=0.5 --workdir=/tmp/capacity
  python -m experiments.continual_learning --optimizer=adamw \
      --weight_decay=0.01 --workdir=/tmp/adamw
"""

import dataclasses

from absl import app, flags

from experiments import common
from experiments import continual_learning_tasks as tasks_lib
from experiments.continual_learning_lib import METHODS, Config, run

_DEFAULTS = Config()

flags.DEFINE_list(
    "sequences",
    list(_DEFAULTS.sequences),
    f"Task sequences, among {', '.join(tasks_lib.NAMES)}.",
)
flags.DEFINE_integer(
    "permuted_tasks", _DEFAULTS.permuted_tasks, "Tasks of a permuted sequence."
)
flags.DEFINE_list(
    "methods",
    list(_DEFAULTS.methods),
    f"Methods, among {', '.join(METHODS)} (PackNet with hand-written gradient"
    " masks instead of maskfit's: the control).",
)
flags.DEFINE_list(
    "hidden_units",
    [str(u) for u in _DEFAULTS.hidden_units],
    "Units of each hidden layer.",
)
flags.DEFINE_string(
    "optimizer",
    _DEFAULTS.optimizer,
    f"A keras.optimizers name: {', '.join(sorted(common.OPTIMIZERS))}.",
)
flags.DEFINE_float("learning_rate", _DEFAULTS.learning_rate, "Learning rate.")
flags.DEFINE_float(
    "weight_decay",
    _DEFAULTS.weight_decay,
    "The optimizer's weight_decay (unset: the optimizer's default).",
)
flags.DEFINE_integer("batch_size", _DEFAULTS.batch_size, "Examples per step.")
flags.DEFINE_integer("epochs", _DEFAULTS.epochs, "Passes over each task.")
flags.DEFINE_integer(
    "retrain_epochs",
    _DEFAULTS.retrain_epochs,
    "PackNet: passes over each task after pruning, training its survivors.",
)
flags.DEFINE_float(
    "prune_fraction",
    _DEFAULTS.prune_fraction,
    "PackNet: fraction of the weights a task trained that are freed for later"
    " tasks, per layer.",
)
flags.DEFINE_float(
    "ewc_strength", _DEFAULTS.ewc_strength, "EWC: the penalty's strength (lambda)."
)
flags.DEFINE_integer(
    "ewc_samples",
    _DEFAULTS.ewc_samples,
    "EWC: training examples per task for the Fisher information.",
)
flags.DEFINE_list("seeds", [str(s) for s in _DEFAULTS.seeds], "Seeds.")
flags.DEFINE_integer(
    "mnist1d_samples",
    _DEFAULTS.mnist1d_samples,
    "Generate this many MNIST-1D examples instead of 5,000 (quick runs).",
)
flags.DEFINE_integer(
    "steps_per_execution",
    _DEFAULTS.steps_per_execution,
    "Training steps per call of the compiled step.",
)
flags.DEFINE_bool("jit_compile", _DEFAULTS.jit_compile, "Compile with XLA.")
flags.DEFINE_string("workdir", None, "Directory for the run's outputs.")
flags.mark_flag_as_required("workdir")

FLAGS = flags.FLAGS


def _ints(name):
    try:
        return tuple(int(v) for v in getattr(FLAGS, name))
    except ValueError as e:
        raise app.UsageError(
            f"--{name} takes comma-separated integers. Received:"
            f" {','.join(getattr(FLAGS, name))}"
        ) from e


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
    values = {f.name: getattr(FLAGS, f.name) for f in dataclasses.fields(Config)}
    values.update(
        sequences=tuple(FLAGS.sequences),
        methods=tuple(FLAGS.methods),
        hidden_units=_ints("hidden_units"),
        seeds=_ints("seeds"),
    )
    try:
        config = Config(**values)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    run(config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
