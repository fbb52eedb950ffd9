"""maskfit's modules import each other without a cycle (read from the source).

The graph has an edge from a module to every maskfit module it imports, at
any depth of its code (an import inside a function is an edge too: it runs
before that function can finish), and to the `__init__` of every package it
imports from outside that package (importing `maskfit.a.b` from outside
`maskfit.a` runs `maskfit/a/__init__.py` first). The top package's own
`__init__` is left out: every module of maskfit runs it first by
construction, and it imports the public names of the rest.
"""

import ast
import pathlib

import pytest

import maskfit

pytestmark = pytest.mark.backends("tensorflow", "jax")

_ROOT = pathlib.Path(maskfit.__file__).parent


def _module_name(path):
    parts = list(path.relative_to(_ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(p): p for p in sorted(_ROOT.rglob("*.py"))}


def _package_of(name, modules):
    path = modules[name]
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imported(node, name, modules):
    """The maskfit modules an import statement in module `name` names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = _package_of(name, modules)
    base = node.module or ""
    if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
        base = f"{base}.{node.module}" if node.module else base
    found = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        found.append(submodule if submodule in modules else base)
    return found


def import_graph():
    """`{module: {modules it imports}}` over maskfit, by the rule above."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        own_package = _package_of(name, modules)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(node, name, modules):
                if target not in modules:
                    continue
                edges.add(target)
                parts = target.split(".")
                for i in range(2, len(parts)):
                    package = ".".join(parts[:i])
                    inside = own_package == package or own_package.startswith(
                        package + "."
                    )
                    if not inside:
                        edges.add(package)
        edges.discard("maskfit")
        edges.discard(name)
        graph[name] = edges
    graph["maskfit"] = set()
    return graph


def cycles(graph):
    """The cycles of `graph`, one per strongly connected component (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_maskfit_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, (
        "maskfit's modules import each other in a cycle (each list is one set"
        f" of modules that reach each other): {found}"
    )


def test_the_graph_sees_imports_inside_functions_and_package_inits():
    graph = import_graph()

    assert "maskfit.structured" in graph["maskfit.pruning"]
    assert "maskfit.units.lookup" in graph["maskfit.spec.masks"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
