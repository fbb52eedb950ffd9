"""Import paths that moved, kept for one release with a `DeprecationWarning`.

maskfit 0.3.0 put its modules in packages by idea (CHANGELOG.md). Every module
path that an earlier release had is in `MOVED`, with the path it has now: an
import of the old path returns the module at the new path (the same object, so
`isinstance` checks and registrations agree) and warns once, naming the new
path. The old paths go in `REMOVED_IN`. Public names (`maskfit.*`,
`maskfit.pruning.*`, `maskfit.structured.*`, `maskfit.sparse.*`) never moved.

Example:
  >>> import warnings
  >>> with warnings.catch_warnings(record=True) as caught:
  ...     warnings.simplefilter("always")
  ...     from maskfit import mask_rules
  >>> mask_rules.__name__
  'maskfit.spec.rules'
  >>> "maskfit.spec.rules" in str(caught[0].message)
  True
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "REMOVED_IN", "install"]

REMOVED_IN = "0.4.0"

# {old module path: new module path}.
MOVED = {
    # 0.1.0's paths of the mask rules and the dropped-entry traits.
    "maskfit.mask_rules": "maskfit.spec.rules",
    "maskfit.dropped_entries": "maskfit.optim.traits",
    # 0.3.0: the rules' modules of the step became the package `step.rules`.
    "maskfit.step.rule_keeps": "maskfit.step.rules.keeps",
    "maskfit.step.rule_runner": "maskfit.step.rules.runner",
    "maskfit.step.rule_update": "maskfit.step.rules.update",
}


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path, with the warning."""

    def __init__(self, new):
        self._new = new

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        old = module.__name__
        warnings.warn(
            f"`{old}` moved to `{self._new}` in maskfit 0.3.0; import it from"
            f" there (the old path is removed in maskfit {REMOVED_IN}).",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system reads the module back from `sys.modules` after
        # `exec_module`, so the old path becomes the new module itself.
        sys.modules[old] = importlib.import_module(self._new)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old paths of `MOVED`, and nothing else."""

    def find_spec(self, fullname, path, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


_FINDER = _Finder()


def install():
    """Puts the finder of moved paths first on `sys.meta_path` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
