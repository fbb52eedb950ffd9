"""The package that `pip install .` builds holds every module of maskfit."""

import os

import pytest

import maskfit

pytestmark = pytest.mark.backends("tensorflow", "jax")

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


def test_the_version_is_written_once_and_the_changelog_names_it():
    # setup.cfg reads `maskfit.__version__` (attr:), so a wheel cannot disagree.
    with open(os.path.join(ROOT, "setup.cfg")) as f:
        assert "version = attr: maskfit.__version__" in f.read()
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        # An "## Unreleased" entry on top gathers what the next release adds.
        entries = [
            line
            for line in f
            if line.startswith("## ") and line.strip() != "## Unreleased"
        ]
    assert entries, "CHANGELOG.md has no '## <version> (<date>)' entry"
    assert entries[0].split()[1] == maskfit.__version__, (
        f"CHANGELOG.md's newest entry is {entries[0].strip()!r}; maskfit.__version__"
        f" is {maskfit.__version__!r}: add an entry for it"
    )
