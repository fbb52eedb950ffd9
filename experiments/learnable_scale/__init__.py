"""The learnable-scale experiment: `python -m experiments.learnable_scale`.

`lib.run(config, workdir)` learns y = scale * x with `maskfit.layers.Scale`.
"""

from experiments.learnable_scale.lib import Config, run

__all__ = ["Config", "run"]
