"""Killed runs resumed by Keras's and maskfit's backups: `python -m benchmarks.resume_exactness`."""

import json

from absl import app, flags, logging
from benchmarks.resume_exactness import lib

_WORKDIR = flags.DEFINE_string("workdir", "runs/resume_exactness", "Where to write.")
_KILLS = flags.DEFINE_integer("kills", 8, "Kill steps (random) per contender.")
_SAVE_FREQ = flags.DEFINE_integer("save_freq", 7, "Steps between backups (*_steps).")
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Epochs of 16 steps.")
_JIT = flags.DEFINE_bool("jit_compile", False, "Compile the steps with XLA.")
_CONTENDERS = flags.DEFINE_list("contenders", list(lib.CONTENDERS), "Which to measure.")
_PROCESSES = flags.DEFINE_integer("processes", 2, "Child processes at a time.")
_SEED = flags.DEFINE_integer(
    "seed", 0, "Seed of the model, the data and the kill steps."
)
# Internal: one child run, started by `lib.run` in a process of its own.
_CHILD = flags.DEFINE_string("child", None, "Internal.")
_KILL_STEP = flags.DEFINE_integer("kill_step", 0, "Internal.")
_CONFIG_JSON = flags.DEFINE_string("config_json", None, "Internal.")


def main(argv):
    del argv
    if _CHILD.value:
        config = json.loads(_CONFIG_JSON.value)
        config["contenders"] = tuple(config["contenders"])
        lib.child(lib.Config(**config), _CHILD.value, _KILL_STEP.value, _WORKDIR.value)
        return
    try:
        config = lib.Config(
            kills=_KILLS.value,
            save_freq=_SAVE_FREQ.value,
            epochs=_EPOCHS.value,
            jit_compile=_JIT.value,
            contenders=tuple(_CONTENDERS.value),
            processes=_PROCESSES.value,
            seed=_SEED.value,
        )
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    rows, overhead = lib.run(config, _WORKDIR.value)
    logging.info("Wrote resume_exactness.json and .md to %s", _WORKDIR.value)
    print(lib.format_table(rows, config, overhead))


if __name__ == "__main__":
    app.run(main)
