r"""Iterative magnitude pruning with rewinding: the lottery ticket experiment.

Trains LeNet-300-100 on scikit-learn's digits data, prunes each layer's
smallest-magnitude surviving weights, rewinds the survivors to their values at
`--rewind_step` and trains again, for `--rounds` rounds and each of `--seeds`;
the random-reinit and random-pruning controls train each round too. Writes
`config.json`, `metrics.json`, `table.md`, `lottery_ticket.png` and TensorBoard
events under `--workdir`. Needs the `experiments` extra (scikit-learn; matplotlib
for the figure). The logic is in `lottery_ticket_lib`.

Usage (docs/lottery_ticket.md has their results):
  python -m experiments.lottery_ticket --workdir=/tmp/lottery_ticket
  python -m experiments.lottery_ticket --rewind_step=100 --workdir=/tmp/rewind
  python -m experiments.lottery_ticket --rounds=18 --train_steps=3000 \
      --workdir=/tmp/lottery_18
"""

import dataclasses

from absl import app, flags

from experiments import common
from experiments.lottery_ticket_lib import Config, run

_DEFAULTS = Config()

flags.DEFINE_list(
    "hidden_units",
    [str(u) for u in _DEFAULTS.hidden_units],
    "Units of each hidden layer (the paper's LeNet-300-100: 300,100).",
)
flags.DEFINE_string(
    "optimizer",
    _DEFAULTS.optimizer,
    f"A keras.optimizers name: {', '.join(sorted(common.OPTIMIZERS))}.",
)
flags.DEFINE_float("learning_rate", _DEFAULTS.learning_rate, "Learning rate.")
flags.DEFINE_integer("batch_size", _DEFAULTS.batch_size, "Examples per step.")
flags.DEFINE_integer("train_steps", _DEFAULTS.train_steps, "Steps of each training.")
flags.DEFINE_integer(
    "eval_every",
    _DEFAULTS.eval_every,
    "Steps between evaluations (validation loss for early stopping, test accuracy).",
)
flags.DEFINE_integer(
    "rounds", _DEFAULTS.rounds, "Rounds of pruning after the dense run."
)
flags.DEFINE_float(
    "prune_rate",
    _DEFAULTS.prune_rate,
    "Fraction of each hidden layer's surviving weights pruned per round; the"
    " output layer prunes half this fraction.",
)
flags.DEFINE_integer(
    "rewind_step",
    _DEFAULTS.rewind_step,
    "Survivors go back to their values after this many steps of the dense run"
    " (0: the original initialisation).",
)
flags.DEFINE_list(
    "seeds", [str(s) for s in _DEFAULTS.seeds], "Seeds; each runs every round."
)
flags.DEFINE_float(
    "validation_fraction",
    _DEFAULTS.validation_fraction,
    "Fraction of the data held out for early stopping.",
)
flags.DEFINE_float(
    "test_fraction", _DEFAULTS.test_fraction, "Fraction of the data held out to test."
)
flags.DEFINE_bool("jit_compile", _DEFAULTS.jit_compile, "Compile the step with XLA.")
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
    values.update(hidden_units=_ints("hidden_units"), seeds=_ints("seeds"))
    try:
        config = Config(**values)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    run(config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
