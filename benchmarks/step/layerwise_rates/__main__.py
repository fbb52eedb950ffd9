import dataclasses

from absl import app, logging
from benchmarks.layerwise_rates import lib

from experiments.common import cli

HELP = {
    "blocks": "Dense blocks, the head included.",
    "width": "Units per block.",
    "batch": "Batch size.",
    "classes": "Classes of the data.",
    "decay": "Learning-rate factor per block.",
    "learning_rate": "AdamW's learning rate (of the head).",
    "weight_decay": "AdamW's weight decay.",
    "decay_steps": "Steps of the learning-rate schedule's decay.",
    "modes": "Modes: graph, jit.",
    "steps": "Steps per timed round.",
    "steps_per_execution": "Steps per train_function.",
    "warmup_steps": "Untimed steps per contender.",
    "repeats": "Rounds over all contenders.",
    "tolerance": "Largest relative difference from MultiOptimizer's weights.",
    "seed": "Seed of the weights and the data.",
}


def _show(config, rows, workdir):
    logging.info("Wrote the table to %s", workdir)
    print(lib.WHAT.format(**dataclasses.asdict(config)))
    print(lib.format_table(rows))


main = cli.config_main(
    lib.Config, lib.run, HELP, workdir="runs/layerwise_rates", show=_show
)

if __name__ == "__main__":
    app.run(main)
