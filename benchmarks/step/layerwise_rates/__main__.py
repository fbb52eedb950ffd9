import dataclasses

from absl import app, logging

from benchmarks.layerwise_rates import lib
from experiments.common import cli


def _show(config, rows, workdir):
    logging.info("Wrote the table to %s", workdir)
    print(lib.WHAT.format(**dataclasses.asdict(config)))
    print(lib.format_table(rows))


main = cli.config_main(lib.Config, lib.run, workdir="runs/layerwise_rates", show=_show)

if __name__ == "__main__":
    app.run(main)
