"""The package that `pip install .` builds holds every module of maskfit."""

import os

import pytest

import maskfit

# Python 3.12+ virtual environments have no setuptools (pip builds in its own).
setuptools = pytest.importorskip(
    "setuptools", reason="needs setuptools to list packages"
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(maskfit.__file__)))


def test_every_folder_of_maskfit_is_a_package_that_setuptools_finds():
    # A folder without __init__.py imports from a checkout (a namespace
    # package) but is left out of the installed wheel.
    folders = {
        os.path.relpath(path, ROOT).replace(os.sep, ".")
        for path, _, files in os.walk(os.path.join(ROOT, "maskfit"))
        if "__pycache__" not in path and any(f.endswith(".py") for f in files)
    }
    found = set(setuptools.find_packages(ROOT, include=["maskfit", "maskfit.*"]))
    assert folders <= found, (
        f"not packages (add an __init__.py): {sorted(folders - found)}"
    )
