"""`ConfigValue`: objects that are nothing but their constructor's arguments."""


class ConfigValue:
    """Equality, hash and repr read from `get_config()`.

    For the small serializable objects a user passes by value (pruning
    schedules, unit importances): two are equal when they are of one class and
    have the same config, and they print as the call that makes them.

    Example:

    >>> class Every(ConfigValue):
    ...     def __init__(self, steps):
    ...         self.steps = steps
    ...     def get_config(self):
    ...         return {"steps": self.steps}
    >>> Every(3) == Every(3), Every(3) == Every(4), Every(3)
    (True, False, Every(steps=3))
    """

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash(type(self).__name__)

    def __repr__(self):
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({arguments})"
