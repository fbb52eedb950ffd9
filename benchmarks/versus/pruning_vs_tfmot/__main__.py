"""TF-MOT vs maskfit pruning, side by side: `python -m benchmarks.pruning_vs_tfmot`.

Needs the `pruning-peer` extra (tf_keras, tensorflow-model-optimization,
scikit-learn). Writes `pruning_vs_tfmot.json`, `pruning_vs_tfmot.md` and
`config.json` under `--workdir`.
"""

from absl import app, flags, logging
from benchmarks.pruning_vs_tfmot import lib as pruning_lib

_WORKDIR = flags.DEFINE_string("workdir", "runs/pruning_vs_tfmot", "Where to write.")
_SCENARIOS = flags.DEFINE_list(
    "scenarios", list(pruning_lib.Config.scenarios), "polynomial, constant, 2:4."
)
_CONTENDERS = flags.DEFINE_list(
    "contenders", list(pruning_lib.Config.contenders), "Contenders to run."
)
_SEEDS = flags.DEFINE_list(
    "seeds", [str(s) for s in pruning_lib.Config.seeds], "Seeds (integers)."
)
_EPOCHS = flags.DEFINE_integer("epochs", pruning_lib.Config.epochs, "Epochs per run.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", pruning_lib.Config.batch_size, "Batch size."
)
_LEARNING_RATE = flags.DEFINE_float(
    "learning_rate", pruning_lib.Config.learning_rate, "Adam's learning rate."
)
_JIT_COMPILE = flags.DEFINE_boolean(
    "jit_compile",
    pruning_lib.Config.jit_compile,
    "Compile both contenders' training steps with XLA.",
)


def main(argv):
    del argv
    try:
        config = pruning_lib.Config(
            scenarios=tuple(_SCENARIOS.value),
            contenders=tuple(_CONTENDERS.value),
            seeds=tuple(int(s) for s in _SEEDS.value),
            epochs=_EPOCHS.value,
            batch_size=_BATCH_SIZE.value,
            learning_rate=_LEARNING_RATE.value,
            jit_compile=_JIT_COMPILE.value,
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    results = pruning_lib.run(config, _WORKDIR.value)
    logging.info("Wrote the tables to %s", _WORKDIR.value)
    print(pruning_lib.format_markdown(results))


if __name__ == "__main__":
    app.run(main)
