"""The lottery_ticket experiment: `python -m experiments.lottery_ticket`."""

from experiments.lottery_ticket.lib import Config, run

__all__ = ["Config", "run"]
