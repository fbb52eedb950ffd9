from absl import app, flags

from benchmarks.freezing import lib
from experiments.common import cli

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


main = cli.config_main(
    lib.Config, _run, workdir="runs/freezing", table=lib.format_table
)

if __name__ == "__main__":
    app.run(main)
