"""Import paths that moved, kept for one release with a `DeprecationWarning`.

maskfit 0.3.0 put its modules in packages by idea (CHANGELOG.md). Every module
path that an earlier release had is in `MOVED`, with the path it has now: an
import of the old path returns the module at the new path (the same object, so
`isinstance` checks and registrations agree) and warns once, naming the new
path. A module whose contents went to several modules maps to all of them, in
order: its old path gives a module whose names are looked up there, each with
a warning that names where it went. The old paths go in `REMOVED_IN`. Public
names (`maskfit.*`, `maskfit.pruning.*`, `maskfit.structured.*`,
`maskfit.sparse.*`) never moved.

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

# One row per module that moved (the first two are the 0.1.0 paths that 0.2.0
# kept as shim modules): its old path, then its new path, or the
# paths it was split into (each of its names is looked up there, in order).
_TABLE = """
maskfit.mask_rules                     maskfit.spec.rules
maskfit.dropped_entries                maskfit.optim.traits
maskfit.kinds.record                   maskfit.records
maskfit.structured.couplings           maskfit.kinds.couplings.base maskfit.kinds.couplings.calls maskfit.kinds.couplings.lookup
maskfit.structured.coupling_parts      maskfit.kinds.couplings.parts
maskfit.structured.declared_check      maskfit.kinds.couplings.check
maskfit.structured.channel_map         maskfit.kinds.couplings.channel_map
maskfit.structured.couplings_keras     maskfit.kinds.couplings.producer maskfit.kinds.dense maskfit.kinds.conv maskfit.kinds.normalization maskfit.kinds.elementwise
maskfit.structured.couplings_passing   maskfit.kinds.elementwise maskfit.kinds.normalization maskfit.kinds.reshaping
maskfit.structured.couplings_sequence  maskfit.kinds.recurrent maskfit.kinds.wrappers maskfit.kinds.attention
maskfit.structured.couplings_ops       maskfit.kinds.ops
maskfit.structured.couplings_hub       maskfit.structured.hub.couplings
maskfit.structured.hub_check           maskfit.structured.hub.check
maskfit.structured.hub_shrink          maskfit.structured.hub.shrink
maskfit.structured.hub_stock           maskfit.structured.hub.stock
maskfit.structured.hub_twins           maskfit.structured.hub.twins
maskfit.structured.keras_graph         maskfit.structured.graph.keras_graph
maskfit.structured.unit_graph          maskfit.structured.graph.dependency
maskfit.structured.unit_nodes          maskfit.structured.graph.nodes maskfit.kinds.couplings.calls
maskfit.structured.explain             maskfit.structured.graph.explain
maskfit.structured.importance          maskfit.structured.scoring.importance
maskfit.structured.activation          maskfit.structured.scoring.activation
maskfit.structured.unit_choice         maskfit.structured.scoring.choice
maskfit.structured.structured          maskfit.structured.prune
maskfit.structured.unit_rule           maskfit.structured.rule
maskfit.step.rule_keeps                maskfit.step.rules.keeps
maskfit.step.rule_runner               maskfit.step.rules.runner
maskfit.step.rule_update               maskfit.step.rules.update
"""

# {old module path: new module path, or a tuple of them where it was split}.
MOVED = {
    old: new[0] if len(new) == 1 else tuple(new)
    for old, *new in (row.split() for row in _TABLE.strip().splitlines())
}


def _warn(old, new, stacklevel):
    warnings.warn(
        f"`{old}` moved to `{new}` in maskfit 0.3.0; import it from there (the"
        f" old path is removed in maskfit {REMOVED_IN}).",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path, with the warning."""

    def __init__(self, new):
        self._new = new

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        old = module.__name__
        if isinstance(self._new, str):
            _warn(old, self._new, stacklevel=2)
            # The import system reads the module back from `sys.modules`
            # after `exec_module`, so the old path becomes the new module.
            sys.modules[old] = importlib.import_module(self._new)
            return
        homes = [importlib.import_module(new) for new in self._new]

        def __getattr__(name):
            # Where a name is defined (its module's `__all__`) before where it
            # is only imported.
            exported = [h for h in homes if name in getattr(h, "__all__", ())]
            present = [
                h for h in homes if not name.startswith("__") and hasattr(h, name)
            ]
            for home in exported + present:
                _warn(f"{old}.{name}", f"{home.__name__}.{name}", stacklevel=2)
                return getattr(home, name)
            raise AttributeError(
                f"module {old!r} has no attribute {name!r} (maskfit 0.3.0 split"
                f" it into {', '.join(self._new)})"
            )

        module.__getattr__ = __getattr__
        module.__doc__ = f"The 0.2.0 path of what is now in {', '.join(self._new)}."


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
