"""Freezing by mask against trainable=False: `python -m benchmarks.freezing`."""

import json

from absl import app, flags, logging
from benchmarks.freezing import lib as freezing_lib

_WORKDIR = flags.DEFINE_string("workdir", "runs/freezing", "Where to write the tables.")
_WIDTH = flags.DEFINE_integer("width", 1024, "Units per hidden layer (step time).")
_MEMORY_WIDTH = flags.DEFINE_integer("memory_width", 2048, "Units per layer (memory).")
_BATCH = flags.DEFINE_integer("batch", 256, "Batch size.")
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per timed round.")
_SPE = flags.DEFINE_integer("steps_per_execution", 10, "Steps per train_function.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Rounds over all contenders.")
_MEMORY_STEPS = flags.DEFINE_integer("memory_steps", 30, "Steps of the memory runs.")
_JIT = flags.DEFINE_bool("jit_compile", False, "Compile the steps with XLA.")
# Internal: one memory measurement, run by `measure_memory` in a process of its own.
_MEMORY_CONTENDER = flags.DEFINE_string("memory_contender", None, "Internal.")
_CONFIG_JSON = flags.DEFINE_string("config_json", None, "Internal.")


def main(argv):
    del argv
    if _MEMORY_CONTENDER.value:
        config = json.loads(_CONFIG_JSON.value)
        config["memory_contenders"] = tuple(config["memory_contenders"])
        config = freezing_lib.Config(**config)
        print(freezing_lib.peak_growth(config, _MEMORY_CONTENDER.value))
        return
    config = freezing_lib.Config(
        width=_WIDTH.value,
        memory_width=_MEMORY_WIDTH.value,
        batch=_BATCH.value,
        steps=_STEPS.value,
        steps_per_execution=_SPE.value,
        repeats=_REPEATS.value,
        memory_steps=_MEMORY_STEPS.value,
        jit_compile=_JIT.value,
    )
    results = freezing_lib.run(config, _WORKDIR.value)
    logging.info("Wrote freezing.json and freezing.md to %s", _WORKDIR.value)
    print(freezing_lib.format_table(results))


if __name__ == "__main__":
    app.run(main)
