from absl import app

from benchmarks.scale import lib
from experiments.common import cli

main = cli.config_main(
    lib.Config, lib.run, workdir="runs/scale", table=lib.format_table
)

if __name__ == "__main__":
    app.run(main)
