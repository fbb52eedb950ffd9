"""A MkDocs hook: the build fails unless every public name is documented.

For each module an API page renders (a `::: maskfit.x` line in docs/api/*.md),
every public name (the module's `__all__`, or without one the public names it
defines) must have a docstring and appear on that page (its
`id="module.name"` anchor in the built HTML); a submodule in `__all__` needs
its own `:::` line. Every public class and function must also have an
`Example:` section with a doctest (`>>>`), which tests/test_api_examples.py
runs; constants (attribute docstrings) and modules need none. The check reads
the code with griffe, as mkdocstrings does, so it sees the docstrings the
site shows. The names in WITHOUT_EXAMPLE are the exceptions the build
tolerates for now, and it fails once one of them has an example, so that the
list can only shrink.
"""

import pathlib
import re

import griffe
from mkdocs.exceptions import PluginError

# Public classes and functions the build lets through without an example:
# none. A name added here needs a reason beside it; the build fails once it has
# an example, so the list only shrinks. tests/test_api_examples.py reads it too
# (a literal set of strings).
WITHOUT_EXAMPLE = set()

_DIRECTIVE = re.compile(r"^:::\s+(maskfit(?:\.\w+)*)\s*$", re.M)
# An `Example:` section header on a line of its own (also `Examples:`, or
# with a caption: `Example (prune to 50% once):`).
_EXAMPLE = re.compile(r"^\s*Examples?(\s+\(.*\))?:\s*$", re.M)


def documented_modules(docs_dir):
    """Maps each module an API page renders to that page's path in docs/."""
    pages = {}
    for page in sorted(pathlib.Path(docs_dir, "api").glob("*.md")):
        for path in _DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            pages[path] = page.relative_to(docs_dir).as_posix()
    return pages


def public_names(module):
    """The module's `__all__`, or without one the public names it defines."""
    if module.exports is not None:
        return [getattr(name, "name", name) for name in module.exports]
    return [
        name
        for name, member in module.members.items()
        if not name.startswith("_") and not member.is_alias
    ]


def has_example(docstring):
    """Whether a docstring has an `Example:` section with a doctest in it."""
    match = _EXAMPLE.search(docstring or "")
    return match is not None and ">>>" in docstring[match.end() :]


def _exported(module, name):
    """The object Python binds to `module.name` (a function over a submodule)."""
    member = module[name]
    if member.is_module and not member.is_alias and name in member.members:
        inner = member.members[name]
        if not inner.is_module:
            member = inner
    return member.final_target if member.is_alias else member


def _modules(package, pages):
    """(module path, its page, the griffe module) of each documented module."""
    for path, page in pages.items():
        module = package if path == package.path else package[path.split(".", 1)[1]]
        if module.is_module:
            yield path, page, module


def problems(package, pages, page_ids):
    """Lists what is undocumented: no docstring, no anchor, no page."""
    found = []
    for path, page, module in _modules(package, pages):
        for name in public_names(module):
            public = f"{path}.{name}"
            target = _exported(module, name)
            if target.is_module:
                if target.path not in pages:
                    found.append(
                        f"{public}: a public module with no `::: {target.path}` page"
                    )
                continue
            has_doc = bool(target.docstring and target.docstring.value.strip())
            if not has_doc:
                found.append(f"{public} ({target.filepath}) has no docstring")
            elif public not in page_ids.get(page, set()):
                found.append(f"{public} is not rendered on {page}")
    return found


def missing_examples(package, pages):
    """Lists the public classes and functions without an `Example:` doctest."""
    found = []
    for path, _, module in _modules(package, pages):
        for name in public_names(module):
            public = f"{path}.{name}"
            target = _exported(module, name)
            if not (target.is_class or target.is_function):
                continue
            example = has_example(target.docstring and target.docstring.value)
            if public in WITHOUT_EXAMPLE:
                if example:
                    found.append(
                        f"{public} has an example now: remove it from WITHOUT_EXAMPLE"
                        " in docs/_hooks/public_api.py"
                    )
            elif not example:
                found.append(
                    f"{public} ({target.filepath}) has no `Example:` section with a"
                    " doctest in its docstring"
                )
    return found


def on_post_build(config, **kwargs):
    pages = documented_modules(config["docs_dir"])
    if not pages:
        return
    root = pathlib.Path(config["config_file_path"]).parent
    package = griffe.load("maskfit", search_paths=[str(root)], resolve_aliases=True)
    page_ids = {}
    for page in set(pages.values()):
        html = pathlib.Path(config["site_dir"], page[: -len(".md")], "index.html")
        page_ids[page] = set(
            re.findall(r'id="([\w.]+)"', html.read_text(encoding="utf-8"))
        )
    found = problems(package, pages, page_ids) + missing_examples(package, pages)
    if found:
        raise PluginError("Public names not documented:\n  " + "\n  ".join(found))
