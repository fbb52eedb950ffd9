"""A static-mask step against steps of rules that update every delta_t steps.

    python -m benchmarks.sparse_step_time --workdir /tmp/sparse_step_time

Issue 25's target: averaged over a run with delta_t = 100, a RigL step costs at
most 1.05 of a static-mask step. Contenders: static (the baseline), SET, RigL,
gradual magnitude pruning every delta_t steps, dense (a reference). The logic
is in `sparse_step_time_lib`.
"""

from absl import app, flags, logging
from benchmarks.sparse_step_time import lib

_DEFAULTS = lib.Config()
_WORKDIR = flags.DEFINE_string("workdir", "runs/sparse_step_time", "Output directory.")
_CONTENDERS = flags.DEFINE_list(
    "contenders", list(_DEFAULTS.contenders), f"From {', '.join(lib.CONTENDERS)}."
)
_MODES = flags.DEFINE_list("modes", list(_DEFAULTS.modes), "graph, jit.")
_DEPTH = flags.DEFINE_integer("depth", _DEFAULTS.depth, "Hidden Dense layers.")
_WIDTH = flags.DEFINE_integer("width", _DEFAULTS.width, "Units per hidden layer.")
_BATCH = flags.DEFINE_integer("batch", _DEFAULTS.batch, "Batch size.")
_SPARSITY = flags.DEFINE_float("sparsity", _DEFAULTS.sparsity, "Target sparsity.")
_DELTA_T = flags.DEFINE_integer("delta_t", _DEFAULTS.delta_t, "Steps between updates.")
_ROUNDS_OF = flags.DEFINE_integer(
    "rounds_of", _DEFAULTS.rounds_of, "Update periods per timed round."
)
_SPE = flags.DEFINE_integer(
    "steps_per_execution", _DEFAULTS.steps_per_execution, "Steps per call."
)
_WARMUP = flags.DEFINE_integer("warmup_steps", _DEFAULTS.warmup_steps, "Untimed steps.")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULTS.repeats, "Rounds per contender.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
    try:
        config = lib.Config(
            contenders=tuple(_CONTENDERS.value),
            modes=tuple(_MODES.value),
            depth=_DEPTH.value,
            width=_WIDTH.value,
            batch=_BATCH.value,
            sparsity=_SPARSITY.value,
            delta_t=_DELTA_T.value,
            rounds_of=_ROUNDS_OF.value,
            steps_per_execution=_SPE.value,
            warmup_steps=_WARMUP.value,
            repeats=_REPEATS.value,
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    rows = lib.run(config, _WORKDIR.value)
    logging.info("Wrote the tables to %s", _WORKDIR.value)
    print(lib.format_table(rows))


if __name__ == "__main__":
    app.run(main)
