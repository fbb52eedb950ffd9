"""Times MaskedModel.fit against keras.Model.fit: `python -m benchmarks.step_time`."""

from absl import app, flags, logging

from benchmarks import harness

_WORKDIR = flags.DEFINE_string("workdir", "runs/step_time", "Where to write the table.")
_MODELS = flags.DEFINE_list("models", ["mlp", "cnn"], "Models: mlp, cnn.")
_MODES = flags.DEFINE_list("modes", ["graph", "jit"], "Modes: graph, jit.")
_OPTIMIZERS = flags.DEFINE_list("optimizers", ["adamw", "sgd"], "adamw, sgd.")
_MASKS = flags.DEFINE_list("masks", ["none", "output", "element"], "Mask kinds.")
_MLP_DEPTH = flags.DEFINE_integer("mlp_depth", 4, "Hidden Dense layers of the MLP.")
_MLP_WIDTH = flags.DEFINE_integer("mlp_width", 1024, "Units per MLP layer.")
_MLP_BATCH = flags.DEFINE_integer("mlp_batch", 256, "MLP batch size.")
_CNN_FILTERS = flags.DEFINE_list("cnn_filters", ["32", "64", "128"], "Conv filters.")
_CNN_IMAGE = flags.DEFINE_integer("cnn_image", 32, "CNN input height and width.")
_CNN_BATCH = flags.DEFINE_integer("cnn_batch", 128, "CNN batch size.")
_SPARSITY = flags.DEFINE_float("sparsity", 0.9, "Frozen share under ElementMask.")
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per timed round.")
_SPE = flags.DEFINE_integer("steps_per_execution", 5, "Steps per train_function.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 10, "Untimed steps per contender.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Rounds over all contenders.")


def main(argv):
    del argv
    config = harness.Config(
        models=tuple(_MODELS.value),
        modes=tuple(_MODES.value),
        optimizers=tuple(_OPTIMIZERS.value),
        masks=tuple(_MASKS.value),
        mlp_depth=_MLP_DEPTH.value,
        mlp_width=_MLP_WIDTH.value,
        mlp_batch=_MLP_BATCH.value,
        cnn_filters=tuple(int(f) for f in _CNN_FILTERS.value),
        cnn_image=_CNN_IMAGE.value,
        cnn_batch=_CNN_BATCH.value,
        sparsity=_SPARSITY.value,
        steps=_STEPS.value,
        steps_per_execution=_SPE.value,
        warmup_steps=_WARMUP.value,
        repeats=_REPEATS.value,
    )
    rows = harness.run(config, _WORKDIR.value)
    logging.info("Wrote the table to %s", _WORKDIR.value)
    print(harness.format_table(rows))


if __name__ == "__main__":
    app.run(main)
