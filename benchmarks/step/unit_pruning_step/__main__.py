from absl import app, logging
from benchmarks.unit_pruning_step import lib

from experiments.common import cli

HELP = {
    "widths": "Units of the input, each hidden layer and the output.",
    "batch": "Batch size.",
    "steps": "Steps per timed round.",
    "steps_per_execution": "Steps per train_function.",
    "warmup_steps": "Untimed steps per contender.",
    "repeats": "Rounds over all contenders.",
    "frequency": "Steps between two pruning updates.",
    "seed": "Seed of the weights and the data.",
}


def _show(config, rows, workdir):
    del config
    logging.info("Wrote unit_pruning_step.json to %s", workdir)
    print(lib.format_table(rows))


main = cli.config_main(
    lib.Config, lib.run, HELP, workdir="runs/unit_pruning_step", show=_show
)

if __name__ == "__main__":
    app.run(main)
