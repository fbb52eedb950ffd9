from absl import app, flags, logging

from benchmarks.resume_exactness import lib
from experiments.common import cli

# Internal: one child run, started by `lib.run` in a process of its own, with
# the run's config as JSON.
_CHILD = flags.DEFINE_string("child", None, "Internal.")
_KILL_STEP = flags.DEFINE_integer("kill_step", 0, "Internal.")
_CONFIG_JSON = flags.DEFINE_string("config_json", None, "Internal.")


def _run(config, workdir):
    if _CHILD.value:
        config = cli.config_from_json(lib.Config, _CONFIG_JSON.value)
        lib.child(config, _CHILD.value, _KILL_STEP.value, workdir)
        return None
    return lib.run(config, workdir)


def _show(config, results, workdir):
    if results is not None:
        rows, overhead = results
        logging.info("Wrote resume_exactness.json and .md to %s", workdir)
        print(lib.format_table(rows, config, overhead))


main = cli.config_main(lib.Config, _run, workdir="runs/resume_exactness", show=_show)

if __name__ == "__main__":
    app.run(main)
