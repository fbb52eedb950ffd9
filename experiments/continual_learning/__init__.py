"""The continual_learning experiment: `python -m experiments.continual_learning`."""

from experiments.continual_learning.lib import Config, run

__all__ = ["Config", "run"]
