from absl import app

from benchmarks.structured_vs_torch_pruning import lib
from experiments.common import cli

main = cli.config_main(
    lib.Config,
    lib.run,
    workdir="runs/structured_vs_torch_pruning",
    table=lib.format_markdown,
)

if __name__ == "__main__":
    app.run(main)
