r"""Trains the seed's two-output model with some outputs frozen by an OutputMask.

Examples:

  python -m experiments.masked_outputs --mode=manual --workdir=/tmp/manual
  python -m experiments.masked_outputs --mode=fit --backprop --workdir=/tmp/fit
  python -m experiments.masked_outputs --strategy=mirrored \
      --precision=mixed_float16 --workdir=/tmp/mirrored
"""

from absl import app, flags, logging

from experiments.common import cli
from experiments.masked_outputs.lib import MODES, Config, run

# Any strategy but 'default' needs --nojit_compile, and in fit mode
# --steps_per_execution=1.


def _log(config, metrics, workdir):
    del workdir
    logging.info(
        "%s: %d steps in %.3f s; prediction for input 1 %s -> %s;"
        " largest change of a masked entry %g",
        config.mode,
        config.steps,
        metrics["train_seconds"],
        [round(p, 4) for p in metrics["initial_prediction"]],
        [round(p, 4) for p in metrics["final_prediction"]],
        metrics["masked_max_abs_change"],
    )


main = cli.config_main(
    Config,
    run,
    show=_log,
    choices={"mode": MODES},
    kinds={"steps_per_execution": int},
)
FLAGS = flags.FLAGS

if __name__ == "__main__":
    app.run(main)
