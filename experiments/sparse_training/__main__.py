r"""Dense, static sparse, SET, RigL and gradual pruning at equal step budgets.

Trains each method at each sparsity and seed on MNIST-1D (an MLP and its
small 1-D CNN) and scikit-learn's digits (an MLP), and writes `config.json`,
`metrics.json`, `table.md`, `sparse_training.png` and TensorBoard events
under `--workdir`. Needs the `experiments` extra (scikit-learn, mnist1d;
matplotlib for the figure). The logic is in `experiments.sparse_training.lib`;
docs/sparse_training.md has the results.

Usage:
  python -m experiments.sparse_training --workdir=/tmp/sparse_training
  python -m experiments.sparse_training --tasks=mnist1d/mlp --seeds=0 \
      --sparsities=0.9 --workdir=/tmp/sparse_quick
"""

from absl import app, flags

from experiments.common import cli
from experiments.sparse_training.lib import Config, run

HELP = {
    "tasks": "'<data set>/<model>' pairs.",
    "methods": "Methods: dense, static, set, rigl, pruning.",
    "sparsities": "Target sparsities.",
    "train_steps": "Steps of every training.",
    "eval_every": "Steps between test evaluations.",
    "steps_per_execution": "Steps per compiled call.",
    "mlp_units": "MLP widths.",
    "cnn_filters": "CNN channels per layer.",
    "sparsity_distribution": "uniform, erdos_renyi or erdos_renyi_kernel (ERK).",
    "dense_first_layer": "Keep the first layer dense.",
    "delta_t": "Steps between mask updates.",
    "alpha": "Initial drop fraction of SET and RigL.",
    "drop_fraction_anneal": "cosine or constant.",
    "t_end_fraction": "Share of training with mask updates.",
    "prune_begin_fraction": "Pruning starts here.",
    "prune_end_fraction": "Pruning ends here.",
}
main = cli.config_main(Config, run, HELP)
FLAGS = flags.FLAGS

if __name__ == "__main__":
    app.run(main)
