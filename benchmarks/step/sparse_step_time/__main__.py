from absl import app

from benchmarks.sparse_step_time import lib
from experiments.common import cli

main = cli.config_main(
    lib.Config, lib.run, workdir="runs/sparse_step_time", table=lib.format_table
)

if __name__ == "__main__":
    app.run(main)
