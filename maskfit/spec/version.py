"""The one counter that changes whenever a mask or a rule is declared or removed.

The training step compares it with the value it last synchronized at, so a
`fit` after `set_mask` or `set_rule` reads the declarations again, and one
without skips that walk over the model.
"""

import itertools

__all__ = ["bump", "current"]

_counter = itertools.count(1)
_current = [0]


def bump():
    """Records that a declaration changed."""
    _current[0] = next(_counter)


def current():
    """A number that changes each time any mask or rule is set or removed."""
    return _current[0]
