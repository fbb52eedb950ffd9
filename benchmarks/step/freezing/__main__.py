from absl import app, flags, logging
from benchmarks.freezing import lib

from experiments.common import cli

HELP = {
    "depth": "Hidden Dense layers (step time).",
    "width": "Units per hidden layer (step time).",
    "batch": "Batch size.",
    "frozen_layers": "Layers frozen, from the first.",
    "steps_per_execution": "Steps per train_function.",
    "steps": "Steps per timed round.",
    "warmup_steps": "Untimed steps per contender.",
    "repeats": "Rounds over all contenders.",
    "jit_compile": "Compile the steps with XLA.",
    "memory_width": "Units per layer (memory).",
    "memory_steps": "Steps of the memory runs.",
    "memory_contenders": "Contenders whose memory is measured.",
    "seed": "Seed of the weights and the data.",
}
# Internal: one memory measurement, run by `lib.measure_memory` in a process
# of its own, with the run's config as JSON.
_MEMORY_CONTENDER = flags.DEFINE_string("memory_contender", None, "Internal.")
_CONFIG_JSON = flags.DEFINE_string("config_json", None, "Internal.")


def _run(config, workdir):
    if _MEMORY_CONTENDER.value:
        config = cli.config_from_json(lib.Config, _CONFIG_JSON.value)
        print(lib.peak_growth(config, _MEMORY_CONTENDER.value))
        return None
    return lib.run(config, workdir)


def _show(config, results, workdir):
    del config
    if results is not None:
        logging.info("Wrote freezing.json and freezing.md to %s", workdir)
        print(lib.format_table(results))


main = cli.config_main(lib.Config, _run, HELP, workdir="runs/freezing", show=_show)

if __name__ == "__main__":
    app.run(main)
