"""Layer-wise decay, multipliers against MultiOptimizer.

python -m benchmarks.layerwise_rates --workdir /tmp/layerwise_rates
"""

import dataclasses

from absl import app, flags, logging
from benchmarks.layerwise_rates import lib

_WORKDIR = flags.DEFINE_string("workdir", "runs/layerwise_rates", "Where to write.")
_BLOCKS = flags.DEFINE_integer("blocks", 12, "Dense blocks, the head included.")
_WIDTH = flags.DEFINE_integer("width", 256, "Units per block.")
_BATCH = flags.DEFINE_integer("batch", 128, "Batch size.")
_DECAY = flags.DEFINE_float("decay", 0.8, "Learning-rate factor per block.")
_MODES = flags.DEFINE_list("modes", ["graph", "jit"], "Modes: graph, jit.")
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per timed round.")
_SPE = flags.DEFINE_integer("steps_per_execution", 5, "Steps per train_function.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 10, "Untimed steps per contender.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Rounds over all contenders.")


def main(argv):
    del argv
    try:
        config = _config()
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    rows = lib.run(config, _WORKDIR.value)
    logging.info("Wrote the table to %s", _WORKDIR.value)
    print(lib.WHAT.format(**dataclasses.asdict(config)))
    print(lib.format_table(rows))


def _config():
    return lib.Config(
        blocks=_BLOCKS.value,
        width=_WIDTH.value,
        batch=_BATCH.value,
        decay=_DECAY.value,
        modes=tuple(_MODES.value),
        steps=_STEPS.value,
        steps_per_execution=_SPE.value,
        warmup_steps=_WARMUP.value,
        repeats=_REPEATS.value,
    )


if __name__ == "__main__":
    app.run(main)
