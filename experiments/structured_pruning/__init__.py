"""The structured_pruning experiment: `python -m experiments.structured_pruning`."""

from experiments.structured_pruning.lib import Config, run

__all__ = ["Config", "run"]
