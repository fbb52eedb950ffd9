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

main = cli.config_main(Config, run)
FLAGS = flags.FLAGS

if __name__ == "__main__":
    app.run(main)
