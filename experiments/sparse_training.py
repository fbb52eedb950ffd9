r"""Dense, static sparse, SET, RigL and gradual pruning at equal step budgets.

Trains each method at each sparsity and seed on MNIST-1D (an MLP and its
small 1-D CNN) and scikit-learn's digits (an MLP), and writes `config.json`,
`metrics.json`, `table.md`, `sparse_training.png` and TensorBoard events
under `--workdir`. Needs the `experiments` extra (scikit-learn, mnist1d;
matplotlib for the figure). The logic is in `sparse_training_lib`;
docs/sparse_training.md has the results.

Usage:
  python -m experiments.sparse_training --workdir=/tmp/sparse_training
  python -m experiments.sparse_training --tasks=mnist1d/mlp --seeds=0 \
      --sparsities=0.9 --workdir=/tmp/sparse_quick
"""

import dataclasses

from absl import app, flags

from experiments import common
from experiments.sparse_training_lib import Config, run

_DEFAULTS = Config()

flags.DEFINE_list("tasks", list(_DEFAULTS.tasks), "'<data set>/<model>' pairs.")
flags.DEFINE_list(
    "methods",
    list(_DEFAULTS.methods),
    "Methods: dense, static, set, rigl, pruning.",
)
flags.DEFINE_list(
    "sparsities", [str(s) for s in _DEFAULTS.sparsities], "Target sparsities."
)
flags.DEFINE_list("seeds", [str(s) for s in _DEFAULTS.seeds], "Seeds.")
flags.DEFINE_integer("train_steps", _DEFAULTS.train_steps, "Steps of every training.")
flags.DEFINE_integer("batch_size", _DEFAULTS.batch_size, "Examples per step.")
flags.DEFINE_string(
    "optimizer",
    _DEFAULTS.optimizer,
    f"A keras.optimizers name: {', '.join(sorted(common.OPTIMIZERS))}.",
)
flags.DEFINE_float("learning_rate", _DEFAULTS.learning_rate, "Learning rate.")
flags.DEFINE_integer(
    "eval_every", _DEFAULTS.eval_every, "Steps between test evaluations."
)
flags.DEFINE_integer(
    "steps_per_execution", _DEFAULTS.steps_per_execution, "Steps per compiled call."
)
flags.DEFINE_list("mlp_units", [str(u) for u in _DEFAULTS.mlp_units], "MLP widths.")
flags.DEFINE_list(
    "cnn_filters", [str(f) for f in _DEFAULTS.cnn_filters], "CNN channels per layer."
)
flags.DEFINE_string(
    "sparsity_distribution",
    _DEFAULTS.sparsity_distribution,
    "uniform, erdos_renyi or erdos_renyi_kernel (ERK).",
)
flags.DEFINE_bool(
    "dense_first_layer", _DEFAULTS.dense_first_layer, "Keep the first layer dense."
)
flags.DEFINE_integer("delta_t", _DEFAULTS.delta_t, "Steps between mask updates.")
flags.DEFINE_float("alpha", _DEFAULTS.alpha, "Initial drop fraction of SET and RigL.")
flags.DEFINE_string(
    "drop_fraction_anneal", _DEFAULTS.drop_fraction_anneal, "cosine or constant."
)
flags.DEFINE_float(
    "t_end_fraction", _DEFAULTS.t_end_fraction, "Share of training with mask updates."
)
flags.DEFINE_float(
    "prune_begin_fraction", _DEFAULTS.prune_begin_fraction, "Pruning starts here."
)
flags.DEFINE_float(
    "prune_end_fraction", _DEFAULTS.prune_end_fraction, "Pruning ends here."
)
flags.DEFINE_bool("jit_compile", _DEFAULTS.jit_compile, "Compile the step with XLA.")
flags.DEFINE_string("workdir", None, "Directory for the run's outputs.")
flags.mark_flag_as_required("workdir")

FLAGS = flags.FLAGS

_LISTS = {"sparsities": float, "seeds": int, "mlp_units": int, "cnn_filters": int}


def _parsed(name, kind):
    try:
        return tuple(kind(v) for v in getattr(FLAGS, name))
    except ValueError as e:
        raise app.UsageError(
            f"--{name} takes comma-separated {kind.__name__}s. Received:"
            f" {','.join(getattr(FLAGS, name))}"
        ) from e


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
    values = {f.name: getattr(FLAGS, f.name) for f in dataclasses.fields(Config)}
    values.update({name: _parsed(name, kind) for name, kind in _LISTS.items()})
    values.update(tasks=tuple(FLAGS.tasks), methods=tuple(FLAGS.methods))
    try:
        config = Config(**values)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    run(config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
