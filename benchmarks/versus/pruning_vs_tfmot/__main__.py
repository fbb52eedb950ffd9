from absl import app, logging
from benchmarks.pruning_vs_tfmot import lib

from experiments.common import cli

HELP = {
    "scenarios": "polynomial, constant, 2:4.",
    "contenders": "Contenders to run.",
    "seeds": "Seeds (integers).",
    "hidden": "Units of each hidden layer.",
    "epochs": "Epochs per run.",
    "batch_size": "Batch size.",
    "learning_rate": "Adam's learning rate.",
    "jit_compile": "Compile both contenders' training steps with XLA.",
    "test_fraction": "Fraction of the data held out to test.",
    "split_seed": "Seed of the train/test split.",
    "max_train_examples": "Keep this many training examples (0: all).",
}


def _show(config, results, workdir):
    del config
    logging.info("Wrote the tables to %s", workdir)
    print(lib.format_markdown(results))


main = cli.config_main(
    lib.Config, lib.run, HELP, workdir="runs/pruning_vs_tfmot", show=_show
)

if __name__ == "__main__":
    app.run(main)
