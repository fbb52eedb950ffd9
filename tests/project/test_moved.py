"""Module paths of earlier releases import the module at its new path, with a warning."""

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings

import pytest

from maskfit import moved

pytestmark = pytest.mark.backends("tensorflow", "jax")

_WHOLE = sorted(old for old, new in moved.MOVED.items() if isinstance(new, str))
_SPLIT = sorted(old for old, new in moved.MOVED.items() if not isinstance(new, str))


def _import_fresh(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    return module, [str(w.message) for w in caught if w.category is DeprecationWarning]


@pytest.mark.parametrize("old", _WHOLE)
def test_an_old_path_is_the_new_module_and_warns_naming_it(old, monkeypatch):
    new = moved.MOVED[old]
    module, messages = _import_fresh(old, monkeypatch)
    assert module is importlib.import_module(new)
    assert len(messages) == 1, messages
    assert f"`{new}`" in messages[0] and moved.REMOVED_IN in messages[0]


@pytest.mark.parametrize("old", _SPLIT)
def test_a_split_path_finds_each_name_where_it_went_and_says_where(old, monkeypatch):
    module, _ = _import_fresh(old, monkeypatch)
    homes = [importlib.import_module(new) for new in moved.MOVED[old]]
    seen = set()
    for home in homes:
        names = [n for n in home.__all__ if n not in seen]
        seen.update(home.__all__)
        assert names, f"{home.__name__} adds no name to {old}"
        for name in names:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                found = getattr(module, name)
            assert found is getattr(home, name), (old, name)
            (message,) = [str(w.message) for w in caught]
            assert f"`{home.__name__}.{name}`" in message, message
    with pytest.raises(AttributeError, match="split it into"):
        module.no_such_name  # noqa: B018


def test_every_new_path_exists_and_no_file_is_left_at_an_old_one():
    for old, new in moved.MOVED.items():
        for path in [new] if isinstance(new, str) else new:
            assert importlib.util.find_spec(path) is not None, path
        parent, _, name = old.rpartition(".")
        search = importlib.import_module(parent).__path__
        assert importlib.machinery.PathFinder.find_spec(name, search) is None, old


def test_names_outside_the_table_are_left_to_the_import_system():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("maskfit.no_such_module")
