"""Private Keras members: every one maskfit uses exists, and only internals/ names them."""

import ast
import pathlib

import maskfit
from maskfit import internals


def test_every_private_member_maskfit_uses_exists():
    missing = internals.missing_members()
    assert not missing, (
        "This Keras/TensorFlow release lacks private members maskfit relies on"
        f" (see maskfit/internals/ for what each is for): {missing}"
    )


# The contract of `maskfit/internals/`, kept by a scan of the source: outside
# it, no module imports `keras.src` or TensorFlow's private modules, reaches
# `keras.src` or `tf.__internal__` by attribute, or names an underscore member
# that maskfit does not define itself. An underscore member maskfit defines
# nowhere (as a function, class, method, variable or attribute it assigns)
# is someone else's: Keras's or TensorFlow's. Dunders are Python's, and
# namedtuple's `_replace`, `_asdict`, `_fields`, `_make` are public API.

_PACKAGE = pathlib.Path(maskfit.__file__).parent
_PRIVATE_MODULES = ("keras.src", "tensorflow.python", "tensorflow.core", "tf_keras")
_NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
_SETTERS = {"setattr", "set_untracked", "set_method", "__setattr__"}
_GETTERS = {"getattr", "hasattr", "setattr", "delattr"}


def _modules(inside_internals):
    for path in sorted(_PACKAGE.rglob("*.py")):
        if ("internals" in path.relative_to(_PACKAGE).parts) == inside_internals:
            yield path, ast.parse(path.read_text(), str(path))


def _is_private(name):
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in _NAMEDTUPLE_API


def _called_name(node):
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _maskfit_private_names():
    """Underscore names maskfit defines outside internals/ (its own privates)."""
    names = set()
    for _, tree in _modules(inside_internals=False):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Call) and _called_name(node) in _SETTERS:
                if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                    names.add(node.args[1].value)
    return {n for n in names if isinstance(n, str) and _is_private(n)}


def _foreign_private_uses(tree, own):
    """`(line, what)` for each private Keras/TensorFlow member `tree` names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        else:
            modules = []
        for module in modules:
            if module.startswith(_PRIVATE_MODULES):
                yield node.lineno, f"import {module}"
        if isinstance(node, ast.Attribute):
            if node.attr == "__internal__" or (
                node.attr == "src"
                and isinstance(node.value, ast.Name)
                and node.value.id == "keras"
            ):
                yield node.lineno, f".{node.attr}"
            elif isinstance(node.ctx, ast.Load) and _is_private(node.attr):
                if node.attr not in own:
                    yield node.lineno, f".{node.attr}"
        if isinstance(node, ast.Call) and _called_name(node) in _GETTERS:
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                if _is_private(name.value) and name.value not in own:
                    yield node.lineno, f"{_called_name(node)}(..., {name.value!r})"


def test_no_module_outside_internals_names_a_private_keras_member():
    own = _maskfit_private_names()
    found = [
        f"{path.relative_to(_PACKAGE.parent)}:{line}: {what}"
        for path, tree in _modules(inside_internals=False)
        for line, what in _foreign_private_uses(tree, own)
    ]
    assert not found, (
        "Private Keras/TensorFlow members belong in maskfit/internals/ (a named"
        f" accessor that says why, and the versions checked): {found}"
    )


def test_the_scan_finds_what_it_looks_for():
    source = (
        "import keras\n"
        "from keras.src.models import functional\n"
        "x = model._nodes_by_depth\n"
        "y = getattr(model, '_functional', None)\n"
        "z = keras.src.ops\n"
        "ok = self.__class__, point._replace(a=1), model._mine\n"
    )
    found = list(_foreign_private_uses(ast.parse(source), own={"_mine"}))

    assert [what for _, what in found] == [
        "import keras.src.models",
        "._nodes_by_depth",
        "getattr(..., '_functional')",
        ".src",
    ]
