from absl import app, logging
from benchmarks.step_time import lib

from experiments.common import cli

HELP = {
    "models": "Models: mlp, cnn.",
    "modes": "Modes: graph, jit.",
    "optimizers": "adamw, sgd.",
    "masks": "Mask kinds.",
    "mlp_depth": "Hidden Dense layers of the MLP.",
    "mlp_width": "Units per MLP layer.",
    "mlp_batch": "MLP batch size.",
    "cnn_filters": "Conv filters.",
    "cnn_image": "CNN input height and width.",
    "cnn_batch": "CNN batch size.",
    "classes": "Classes of the data.",
    "sparsity": "Frozen share under ElementMask.",
    "steps": "Steps per timed round.",
    "steps_per_execution": "Steps per train_function.",
    "warmup_steps": "Untimed steps per contender.",
    "repeats": "Rounds over all contenders.",
    "seed": "Seed of the weights and the data.",
}


def _show(config, rows, workdir):
    del config
    logging.info("Wrote the table to %s", workdir)
    print(lib.format_table(rows))


main = cli.config_main(lib.Config, lib.run, HELP, workdir="runs/step_time", show=_show)

if __name__ == "__main__":
    app.run(main)
