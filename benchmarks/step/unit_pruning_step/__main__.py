from absl import app

from benchmarks.unit_pruning_step import lib
from experiments.common import cli

main = cli.config_main(
    lib.Config, lib.run, workdir="runs/unit_pruning_step", table=lib.format_table
)

if __name__ == "__main__":
    app.run(main)
