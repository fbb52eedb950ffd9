r"""Iterative magnitude pruning with rewinding: the lottery ticket experiment.

Trains LeNet-300-100 on scikit-learn's digits data, prunes each layer's
smallest-magnitude surviving weights, rewinds the survivors to their values at
`--rewind_step` and trains again, for `--rounds` rounds and each of `--seeds`;
the random-reinit and random-pruning controls train each round too. Writes
`config.json`, `metrics.json`, `table.md`, `lottery_ticket.png` and TensorBoard
events under `--workdir`. Needs the `experiments` extra (scikit-learn; matplotlib
for the figure). The logic is in `experiments.lottery_ticket.lib`.

Usage (docs/lottery_ticket.md has their results):
  python -m experiments.lottery_ticket --workdir=/tmp/lottery_ticket
  python -m experiments.lottery_ticket --rewind_step=100 --workdir=/tmp/rewind
  python -m experiments.lottery_ticket --rounds=18 --train_steps=3000 \
      --workdir=/tmp/lottery_18
"""

from absl import app, flags

from experiments.common import cli
from experiments.lottery_ticket.lib import Config, run

main = cli.config_main(Config, run)
FLAGS = flags.FLAGS

if __name__ == "__main__":
    app.run(main)
