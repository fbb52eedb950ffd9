"""`ConfigValue`: objects that are nothing but their constructor's arguments."""

import numpy as np


class ConfigValue:
    """Equality, hash, repr and `from_config` read from `get_config()`.

    For the small serializable objects a user passes by value (mask specs,
    mask rules, pruning schedules, unit importances): two are equal when they
    are of one class and have the same config (arrays in it compared by
    value), they print as the call that makes them, and `from_config` calls
    the constructor with the config. A subclass overrides what it says
    otherwise (a spec prints its shapes, not its arrays).

    Example:

    >>> class Every(ConfigValue):
    ...     def __init__(self, steps):
    ...         self.steps = steps
    ...     def get_config(self):
    ...         return {"steps": self.steps}
    >>> Every(3) == Every(3), Every(3) == Every(4), Every(3)
    (True, False, Every(steps=3))
    """

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and _same(
            self.get_config(), other.get_config()
        )

    def __hash__(self):
        return hash(type(self).__name__)

    def __repr__(self):
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


def _same(a, b):
    """`a == b` for configs: dicts by key, arrays (anywhere in them) by value."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return a == b
