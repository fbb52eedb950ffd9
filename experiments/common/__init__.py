"""What every experiment and benchmark shares: the scaffolding under their runs.

- `cli`: flags from a config dataclass, and the `main` of every entry point.
- `training`: optimizers by name, strategy and precision, config checks.
- `report`: JSON, TensorBoard scalars, spreads over seeds, tables, figures.
- `datasets`: scikit-learn's digits and MNIST-1D, split once.
- `latency`, `model_cost`: inference timed side by side; parameters and MACs.
- `structured`: the networks, budget and maskfit arm of structured pruning,
  which `experiments.structured_pruning` and the benchmarks share.

The names most runs need are here too (`common.make_optimizer`,
`common.write_json`...).
"""

from experiments.common.cli import ConfigFlags, config_main, define_scale_flags
from experiments.common.report import (
    SCALAR_METADATA,
    spread,
    write_json,
    write_scalars,
)
from experiments.common.training import (
    OPTIMIZERS,
    check_fraction,
    check_int,
    check_optimizer,
    check_scale,
    compiled_step,
    experiment_run,
    glorot_uniform,
    make_optimizer,
    strategy_and_precision,
)

__all__ = [
    "OPTIMIZERS",
    "SCALAR_METADATA",
    "ConfigFlags",
    "check_fraction",
    "check_int",
    "check_optimizer",
    "check_scale",
    "compiled_step",
    "config_main",
    "define_scale_flags",
    "experiment_run",
    "glorot_uniform",
    "make_optimizer",
    "spread",
    "strategy_and_precision",
    "write_json",
    "write_scalars",
]
