"""The sparse_training experiment: `python -m experiments.sparse_training`."""

from experiments.sparse_training.lib import Config, run

__all__ = ["Config", "run"]
