from absl import app

from benchmarks.pruning_vs_tfmot import lib
from experiments.common import cli

main = cli.config_main(
    lib.Config, lib.run, workdir="runs/pruning_vs_tfmot", table=lib.format_markdown
)

if __name__ == "__main__":
    app.run(main)
