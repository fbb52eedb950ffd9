"""maskfit's layer order and package layout, kept by tools rather than by prose.

The contracts in `pyproject.toml` (`[tool.importlinter]`: the packages'
layer order, the sub-package order of `structured/` and `kinds/`, and no
cycle between modules beside each other) are checked by import-linter, as
`.ci/run` does with `lint-imports`; each kind of broken import is added to a
copy of the package to show the check fails when it should. The layout test
keeps what BUILD.md promises a reader: packages of at most 14 modules,
modules of at most 400 lines, no family of modules told apart by a prefix.
"""

import collections
import pathlib
import shutil
import subprocess
import sys

import pytest

import maskfit

pytestmark = pytest.mark.backends("tensorflow", "jax")

_PACKAGE = pathlib.Path(maskfit.__file__).parent
_ROOT = _PACKAGE.parent


def _lint(root):
    """`(exit code, output)` of `lint-imports` over the maskfit package in `root`."""
    pytest.importorskip("importlinter", reason="import-linter needs Python 3.11+")
    code = (
        "import sys; from importlinter.cli import lint_imports;"
        " sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True,"
        " no_logo=True))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_contracts_hold():
    code, output = _lint(_ROOT)
    assert code == 0, output
    assert "4 kept, 0 broken" in output, output


@pytest.mark.parametrize(
    "module, line, broken",
    [
        # A lower package importing a higher one: units reading structured.
        (
            "units/declaration.py",
            "from maskfit.structured import sizes",
            "maskfit.units is not allowed to import maskfit.structured:"
            " - maskfit.units.declaration -> maskfit.structured.sizes",
        ),
        # The direction 0.3.0 fixed: a layer kind importing structured.
        (
            "kinds/dense.py",
            "from maskfit.structured.graph import nodes",
            "maskfit.kinds is not allowed to import maskfit.structured:"
            " - maskfit.kinds.dense -> maskfit.structured.graph.nodes",
        ),
        # Two independent sub-packages of structured.
        (
            "structured/graph/nodes.py",
            "from maskfit.structured.hub import twins",
            "maskfit.structured.graph is not allowed to import"
            " maskfit.structured.hub: - maskfit.structured.graph.nodes ->"
            " maskfit.structured.hub.twins",
        ),
        # The coupling machinery reading a family record.
        (
            "kinds/couplings/parts.py",
            "from maskfit.kinds import dense",
            "maskfit.kinds.couplings is not allowed to import maskfit.kinds.dense:"
            " - maskfit.kinds.couplings.parts -> maskfit.kinds.dense",
        ),
        # A cycle between two modules of one package (no layer order there).
        (
            "kinds/couplings/calls.py",
            "from maskfit.kinds.couplings import base",
            "No cycles are allowed in maskfit.kinds.couplings. It could be made"
            " acyclic by removing 1 dependency: - .calls -> .base",
        ),
    ],
)
def test_an_import_against_the_order_breaks_a_contract(tmp_path, module, line, broken):
    shutil.copytree(
        _PACKAGE, tmp_path / "maskfit", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(_ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / "maskfit" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    code, output = _lint(tmp_path)
    assert code != 0, output
    flat = " ".join(output.split())
    assert broken in flat, output
    # Only the added import breaks them: the same copy without it passes.
    path.write_text(path.read_text().replace(f"\n{line}  # noqa\n", ""))
    assert _lint(tmp_path)[0] == 0


def _modules():
    return sorted(p for p in _PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_package_holds_more_than_14_modules():
    counts = collections.Counter(p.parent for p in _modules())
    big = {str(d.relative_to(_ROOT)): n for d, n in counts.items() if n > 14}
    assert not big, f"packages with more than 14 modules (split them by idea): {big}"


def test_no_module_is_over_400_lines():
    long = {
        str(p.relative_to(_ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"modules over 400 lines (each likely two ideas): {long}"


def test_no_three_modules_of_a_folder_share_a_name_prefix():
    groups = collections.defaultdict(list)
    for path in _modules():
        stem = path.stem
        if "_" in stem.strip("_"):
            groups[path.parent, stem.strip("_").split("_")[0]].append(stem)
    families = {
        f"{folder.relative_to(_ROOT)}/{prefix}_*": names
        for (folder, prefix), names in groups.items()
        if len(names) >= 3
    }
    assert not families, (
        "modules told apart by a name prefix (make the prefix a sub-package):"
        f" {families}"
    )


def test_every_folder_is_a_package_with_a_docstring():
    for folder in sorted({p.parent for p in _modules()}):
        init = folder / "__init__.py"
        assert init.exists(), folder
        assert init.read_text().lstrip().startswith('"""'), init
