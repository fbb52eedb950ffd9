"""Every public name's docstring example runs, as the API reference shows it.

The names are collected from the `__all__` of each module the API reference
documents (docs/api/*.md; `maskfit.layers` has none: the public names it
defines); a name several modules export (`maskfit.pruning` re-exports
`maskfit.structured`) runs once, under its first public path in MODULES. Its doctests
are its docstring's and those of the methods its class defines, run with
`doctest.DocTestRunner` in a fresh temporary directory after
`keras.backend.clear_session()`, with `keras`, `np`, `tf`, `maskfit` and the
namespaces of the module that exports it and of the one that defines it. A
failure names the public name and shows the failing example, what it printed
and what the docstring expected.

docs/_hooks/public_api.py fails the strict site build when a public class or
function has no `Example:` doctest; this test fails too (without the docs
extra), except for the names on the hook's WITHOUT_EXAMPLE list, which it
skips saying so.
"""

import ast
import doctest
import glob
import importlib
import importlib.util
import inspect
import io
import os
import re
import textwrap
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK = os.path.join(ROOT, "docs", "_hooks", "public_api.py")
# The modules with an API page (docs/api/*.md), structured pruning's names
# under their own package first.
MODULES = (
    "maskfit",
    "maskfit.structured",
    "maskfit.pruning",
    "maskfit.sparse",
    "maskfit.oneshot",
    "maskfit.distribute",
    "maskfit.layers",
)


def _without_example():
    """The hook's WITHOUT_EXAMPLE, read from its source (no mkdocs needed)."""
    with open(HOOK, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "WITHOUT_EXAMPLE" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{HOOK} defines no WITHOUT_EXAMPLE")


WITHOUT_EXAMPLE = _without_example()


def public_names(module):
    """The module's `__all__`, or without one the public names it defines."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and getattr(value, "__module__", None) == module.__name__
        ]
    return list(names)


def _public_objects():
    """`{public path: (object, exporting module)}`, one path per object."""
    seen, found = set(), {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            value = getattr(module, name)
            if isinstance(value, types.ModuleType) or not callable(value):
                continue  # Modules have their own page; constants no example.
            if id(value) not in seen:
                seen.add(id(value))
                found[f"{module_name}.{name}"] = (value, module)
    return found


PUBLIC = _public_objects()


def doctests_of(path, value, module):
    """The doctests of `value`'s docstring and of its class's own methods."""
    defined_in = inspect.getmodule(value)
    globs = dict(vars(module))
    globs.update(vars(defined_in))
    globs.update(keras=keras, np=np, tf=tf, maskfit=maskfit)
    finder = doctest.DocTestFinder(recurse=inspect.isclass(value))
    tests = finder.find(value, path, module=defined_in, globs=globs)
    return [test for test in tests if test.examples]


def run_doctests(tests):
    """(failed examples, the runner's report) of running `tests`."""
    out = io.StringIO()
    runner = doctest.DocTestRunner(verbose=False)
    failed = sum(runner.run(test, out=out.write).failed for test in tests)
    return failed, out.getvalue()


def test_every_documented_module_is_collected():
    documented = set()
    for page in glob.glob(os.path.join(ROOT, "docs", "api", "*.md")):
        with open(page, encoding="utf-8") as f:
            documented.update(re.findall(r"^:::\s+(maskfit[\w.]*)\s*$", f.read(), re.M))
    assert documented == set(MODULES)
    assert set(PUBLIC) >= {"maskfit.MaskedModel", "maskfit.layers.Scale"}
    assert "maskfit.pruning.shrink" not in PUBLIC  # as maskfit.structured.shrink
    for path in WITHOUT_EXAMPLE:
        assert path in PUBLIC, f"WITHOUT_EXAMPLE names {path}, no public name"


@pytest.mark.parametrize("path", list(PUBLIC))
def test_the_public_examples_run(path, tmp_path, monkeypatch):
    value, module = PUBLIC[path]
    tests = doctests_of(path, value, module)
    if path in WITHOUT_EXAMPLE:
        assert not tests, f"{path} has an example now: remove it from WITHOUT_EXAMPLE"
        pytest.skip(f"{path} is on WITHOUT_EXAMPLE in docs/_hooks/public_api.py")
    assert tests, f"{path} has no doctest example in its docstring"
    monkeypatch.chdir(tmp_path)
    keras.backend.clear_session()
    failed, report = run_doctests(tests)
    assert not failed, f"{path}: an example failed\n{report}"


def test_a_failing_example_is_reported_with_its_name():
    def broken():
        """Returns 2.

        Example:

        >>> broken()
        3
        """
        return 2

    tests = doctest.DocTestFinder().find(broken, "maskfit.broken", globs={})
    tests[0].globs["broken"] = broken
    failed, report = run_doctests(tests)
    assert failed == 1
    assert "maskfit.broken" in report and "Expected:\n    3\nGot:\n    2" in report


def test_the_build_check_names_a_public_name_without_example(tmp_path, monkeypatch):
    pytest.importorskip("mkdocs", reason="needs the docs extra: pip install '.[docs]'")
    griffe = pytest.importorskip("griffe", reason="needs the docs extra")
    spec = importlib.util.spec_from_file_location("docs_hook_public_api", HOOK)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A package."""
            __all__ = ["CONSTANT", "Shown", "captioned", "unshown", "prose"]

            CONSTANT = 1
            """A constant: needs no example."""

            class Shown:
                """Has one.

                Example:

                >>> type(Shown()).__name__
                'Shown'
                """

            def captioned():
                """Has one.

                Example (with a caption):

                >>> captioned()
                """

            def unshown():
                """Has a docstring, but no example."""

            def prose():
                """Has an example section, but no doctest.

                Example:
                  call it.
                """
            '''
        )
    )
    loaded = griffe.load("fakepkg", search_paths=[str(tmp_path)])
    found = hook.missing_examples(loaded, {"fakepkg": "api/fakepkg.md"})
    assert len(found) == 2, found
    assert found[0].startswith("fakepkg.unshown") and "no `Example:`" in found[0]
    assert found[1].startswith("fakepkg.prose")
    monkeypatch.setattr(hook, "WITHOUT_EXAMPLE", {"fakepkg.Shown", "fakepkg.unshown"})
    found = hook.missing_examples(loaded, {"fakepkg": "api/fakepkg.md"})
    assert len(found) == 2, found
    assert found[0].startswith("fakepkg.Shown has an example now")
    assert found[1].startswith("fakepkg.prose")
