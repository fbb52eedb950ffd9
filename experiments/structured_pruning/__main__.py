r"""Structured pruning with maskfit: accuracy against measured CPU latency.

Trains issue 23's MLP (1024-1024 hidden) and ResNet-8 (32/64/128 channels,
batch norm) on scikit-learn's digits and MNIST-1D (no download), prunes
25/50/75% of every unit group gradually with `maskfit.pruning.prune_units`
(L2 magnitude, `round_to=8`), fine-tunes, shrinks with
`maskfit.pruning.shrink`, and reports per fraction the parameters, MACs,
test accuracy over seeds, and the CPU latency of the shrunk and the dense
model (batch 1 and 64, compiled inference, median over interleaved rounds).
Writes `config.json`, `metrics.json`, `structured_pruning.md` and
`structured_pruning.png` under `--workdir`. The defaults take about 10
minutes on 2 cores. The logic is in `experiments.structured_pruning.lib`.

Usage (docs/structured_pruning.md has the results):
  python -m experiments.structured_pruning --workdir=/tmp/structured_pruning
  python -m experiments.structured_pruning --datasets=mnist1d --seeds=0,1,2 \
      --epochs=20 --prune_epochs=5 --prune_steps=5 --finetune_epochs=10 \
      --workdir=/tmp/structured_mnist1d
"""

from absl import app

from experiments.common import cli
from experiments.structured_pruning.lib import Config, run

main = cli.config_main(Config, run, show=cli.print_file("structured_pruning.md"))

if __name__ == "__main__":
    app.run(main)
