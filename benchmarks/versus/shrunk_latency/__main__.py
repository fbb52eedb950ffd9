from absl import app

from benchmarks.shrunk_latency import lib
from experiments.common import cli, datasets

main = cli.config_main(
    lib.Config,
    lib.run,
    workdir="runs/shrunk_latency",
    table=lib.format_table,
    choices={"dataset": datasets.NAMES},
)

if __name__ == "__main__":
    app.run(main)
