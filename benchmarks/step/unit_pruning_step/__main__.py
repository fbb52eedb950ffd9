"""Step time while units are pruned: `python -m benchmarks.unit_pruning_step`."""

from absl import app, flags, logging
from benchmarks.unit_pruning_step import lib

_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/unit_pruning_step", "Where to write the table."
)
_BATCH = flags.DEFINE_integer("batch", 64, "Batch size.")
_STEPS = flags.DEFINE_integer("steps", 50, "Steps per timed round.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Rounds over all contenders.")
_FREQUENCY = flags.DEFINE_integer("frequency", 10, "Steps between two pruning updates.")
_JIT = flags.DEFINE_bool("jit_compile", False, "Compile the steps with XLA.")


def main(argv):
    del argv
    config = lib.Config(
        batch=_BATCH.value,
        steps=_STEPS.value,
        repeats=_REPEATS.value,
        frequency=_FREQUENCY.value,
        jit_compile=_JIT.value,
    )
    rows = lib.run(config, _WORKDIR.value)
    logging.info("Wrote unit_pruning_step.json to %s", _WORKDIR.value)
    print(lib.format_table(rows))


if __name__ == "__main__":
    app.run(main)
