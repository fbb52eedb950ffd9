"""Learns y = scale * x with `maskfit.layers.Scale`: the seed's scenario.

The data is `samples` copies of x = 2 with target y = 5, so `scale` should
go from 2.0 to 2.5 under MSE and SGD. The run writes, under `--workdir`,
`config.json`, `metrics.json` and TensorBoard events with the loss and the
scale per epoch. The logic is in `learnable_scale_lib`.

Usage:
  python -m experiments.learnable_scale --workdir=/tmp/learnable_scale
  python -m experiments.learnable_scale --strategy=mirrored \
      --steps_per_execution=1 --nojit_compile --workdir=/tmp/mirrored
"""

import dataclasses

from absl import app, flags

from experiments import common
from experiments.learnable_scale_lib import Config, run

_DEFAULTS = Config()

flags.DEFINE_integer("samples", _DEFAULTS.samples, "Number of (x, y) examples.")
flags.DEFINE_float("x_value", _DEFAULTS.x_value, "Value of every input x.")
flags.DEFINE_float("target", _DEFAULTS.target, "Value of every target y.")
flags.DEFINE_integer("batch_size", _DEFAULTS.batch_size, "Examples per step.")
flags.DEFINE_float("learning_rate", _DEFAULTS.learning_rate, "Learning rate.")
flags.DEFINE_integer("epochs", _DEFAULTS.epochs, "Passes over the data.")
flags.DEFINE_float("initial_scale", _DEFAULTS.initial_scale, "Scale's start.")
flags.DEFINE_string(
    "optimizer",
    _DEFAULTS.optimizer,
    f"A keras.optimizers name: {', '.join(sorted(common.OPTIMIZERS))}.",
)
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Random seed.")
flags.DEFINE_integer(
    "steps_per_execution",
    _DEFAULTS.steps_per_execution,
    "Steps per compiled call; 1 is fit's default. Same updates either way.",
)
flags.DEFINE_bool("jit_compile", _DEFAULTS.jit_compile, "Compile the step with XLA.")
# --strategy and --precision; any strategy but 'default' needs
# --steps_per_execution=1 --nojit_compile.
common.define_scale_flags()
flags.DEFINE_string("workdir", None, "Directory for the run's outputs.")
flags.mark_flag_as_required("workdir")

FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
    values = {f.name: getattr(FLAGS, f.name) for f in dataclasses.fields(Config)}
    try:
        config = Config(**values)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    run(config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
