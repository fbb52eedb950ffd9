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

_K = "maskfit.kinds."
_S = "maskfit.structured."

# {old module path: new module path, or a tuple of them where it was split}.
MOVED = {
    # 0.1.0's paths of the mask rules and the dropped-entry traits.
    "maskfit.mask_rules": "maskfit.spec.rules",
    "maskfit.dropped_entries": "maskfit.optim.traits",
    # 0.3.0: the record type below maskfit.units; the coupling classes beside
    # the records that name them (maskfit.kinds), structured/ by idea.
    "maskfit.kinds.record": "maskfit.records",
    _S + "couplings": (
        _K + "couplings.base",
        _K + "couplings.calls",
        _K + "couplings.lookup",
    ),
    _S + "coupling_parts": _K + "couplings.parts",
    _S + "declared_check": _K + "couplings.check",
    _S + "channel_map": _K + "couplings.channel_map",
    _S + "couplings_keras": (
        _K + "couplings.producer",
        _K + "dense",
        _K + "conv",
        _K + "normalization",
        _K + "elementwise",
    ),
    _S + "couplings_passing": (
        _K + "elementwise",
        _K + "normalization",
        _K + "reshaping",
    ),
    _S + "couplings_sequence": (_K + "recurrent", _K + "wrappers", _K + "attention"),
    _S + "couplings_ops": _K + "ops",
    _S + "couplings_hub": _S + "hub.couplings",
    _S + "hub_check": _S + "hub.check",
    _S + "hub_shrink": _S + "hub.shrink",
    _S + "hub_stock": _S + "hub.stock",
    _S + "hub_twins": _S + "hub.twins",
    _S + "keras_graph": _S + "graph.keras_graph",
    _S + "unit_graph": _S + "graph.dependency",
    _S + "unit_nodes": (_S + "graph.nodes", _K + "couplings.calls"),
    _S + "explain": _S + "graph.explain",
    _S + "importance": _S + "scoring.importance",
    _S + "activation": _S + "scoring.activation",
    _S + "unit_choice": _S + "scoring.choice",
    _S + "structured": _S + "prune",
    _S + "unit_rule": _S + "rule",
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
