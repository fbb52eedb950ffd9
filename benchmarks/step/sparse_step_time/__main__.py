from absl import app, logging
from benchmarks.sparse_step_time import lib

from experiments.common import cli

HELP = {
    "contenders": f"From {', '.join(lib.CONTENDERS)}.",
    "modes": "graph, jit.",
    "depth": "Hidden Dense layers.",
    "width": "Units per hidden layer.",
    "batch": "Batch size.",
    "sparsity": "Target sparsity.",
    "sparsity_distribution": "uniform, erdos_renyi or erdos_renyi_kernel (ERK).",
    "delta_t": "Steps between updates.",
    "alpha": "Initial drop fraction of SET and RigL.",
    "rounds_of": "Update periods per timed round.",
    "steps_per_execution": "Steps per call.",
    "warmup_steps": "Untimed steps.",
    "repeats": "Rounds per contender.",
    "seed": "Seed of the weights and the data.",
}


def _show(config, rows, workdir):
    del config
    logging.info("Wrote the tables to %s", workdir)
    print(lib.format_table(rows))


main = cli.config_main(
    lib.Config, lib.run, HELP, workdir="runs/sparse_step_time", show=_show
)

if __name__ == "__main__":
    app.run(main)
