"""The masked-outputs experiment: `python -m experiments.masked_outputs`.

`lib.run(config, workdir)` trains the seed's two-output model with some
outputs frozen by an `OutputMask`, by `apply_gradients` or by `fit`.
"""

from experiments.masked_outputs.lib import Config, run

__all__ = ["Config", "run"]
