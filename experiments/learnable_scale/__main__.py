"""Learns y = scale * x with `maskfit.layers.Scale`: the seed's scenario.

The data is `samples` copies of x = 2 with target y = 5, so `scale` should
go from 2.0 to 2.5 under MSE and SGD. The run writes, under `--workdir`,
`config.json`, `metrics.json` and TensorBoard events with the loss and the
scale per epoch. The logic is in `experiments.learnable_scale.lib`.

Usage:
  python -m experiments.learnable_scale --workdir=/tmp/learnable_scale
  python -m experiments.learnable_scale --strategy=mirrored \
      --steps_per_execution=1 --nojit_compile --workdir=/tmp/mirrored
"""

from absl import app, flags

from experiments.common import cli
from experiments.learnable_scale.lib import Config, run

# Any strategy but 'default' needs --steps_per_execution=1 --nojit_compile.
main = cli.config_main(Config, run)
FLAGS = flags.FLAGS

if __name__ == "__main__":
    app.run(main)
