r"""Continual learning: PackNet on exact masks, against fine-tuning and others.

Learns Split MNIST-1D (5 tasks of 2 classes, a head per task) and Permuted
MNIST-1D (`--permuted_tasks` tasks of 10 classes, one shared head) task after
task with each method and each of `--seeds`, and reports after each task
the accuracy on every task seen so far, the average accuracy and the
backward transfer. Writes `config.json`, `metrics.json`, `table.md`,
`continual_learning.png` and TensorBoard events under `--workdir`. Needs the
`experiments` extra (mnist1d, scikit-learn; matplotlib for the figure). The
logic is in `experiments.continual_learning.lib`.

Usage (docs/continual_learning.md has their results):
  python -m experiments.continual_learning --workdir=/tmp/continual
  python -m experiments.continual_learning --sequences=permuted_mnist1d \
      --permuted_tasks=10 --prune_fraction=0.5 --workdir=/tmp/capacity
  python -m experiments.continual_learning --optimizer=adamw \
      --weight_decay=0.01 --workdir=/tmp/adamw
"""

from absl import app, flags

from experiments.common import cli
from experiments.continual_learning.lib import Config, run

main = cli.config_main(
    Config, run, kinds={"weight_decay": float, "mnist1d_samples": int}
)
FLAGS = flags.FLAGS

if __name__ == "__main__":
    app.run(main)
