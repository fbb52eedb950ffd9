r"""`python -m experiments.finetune_recipes --workdir DIR`: flags into a Config, then run.

Example:

  python -m experiments.finetune_recipes --workdir=/tmp/finetune_recipes
  python -m experiments.finetune_recipes --methods=full,bitfit --seeds=0 \
      --workdir=/tmp/quick
"""

from absl import app, logging

from experiments.common import cli
from experiments.finetune_recipes import lib


def _log(config, metrics, workdir):
    del config
    for name, m in metrics["methods"].items():
        logging.info(
            "%s accuracy %.3f +- %.3f learnable %d step %.1f ms",
            name,
            m["accuracy_mean"],
            m["accuracy_std"],
            m["learnable"],
            m["step_ms"],
        )
    logging.info(
        "wall %.0f s, cpu %.0f s; results in %s",
        metrics["wall_seconds"],
        metrics["cpu_seconds"],
        workdir,
    )


main = cli.config_main(lib.Config, lib.run, show=_log, choices=None)

if __name__ == "__main__":
    app.run(main)
