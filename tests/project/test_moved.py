"""Module paths of earlier releases import the module at its new path, with a warning."""

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings

import pytest

from maskfit import moved

pytestmark = pytest.mark.backends("tensorflow", "jax")


@pytest.mark.parametrize("old", sorted(moved.MOVED))
def test_an_old_path_is_the_new_module_and_warns_naming_it(old, monkeypatch):
    new = moved.MOVED[old]
    monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert len(messages) == 1, messages
    assert f"`{new}`" in messages[0] and moved.REMOVED_IN in messages[0]


def test_every_new_path_exists_and_no_file_is_left_at_an_old_one():
    for old, new in moved.MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        parent, _, name = old.rpartition(".")
        search = importlib.import_module(parent).__path__
        assert importlib.machinery.PathFinder.find_spec(name, search) is None, old


def test_names_outside_the_table_are_left_to_the_import_system():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("maskfit.no_such_module")
