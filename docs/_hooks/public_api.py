"""A MkDocs hook: the build fails unless every public name is documented.

For each module an API page renders (a `::: maskfit.x` line in docs/api/*.md),
every name in the module's `__all__` must have a docstring and appear on that
page (its `id="module.name"` anchor in the built HTML); a submodule in
`__all__` needs its own `:::` line. The check reads the code with griffe, as
mkdocstrings does, so it sees the docstrings the site shows. Constants count
too: an attribute docstring (a string literal right after the assignment)
documents them.
"""

import pathlib
import re

import griffe
from mkdocs.exceptions import PluginError

_DIRECTIVE = re.compile(r"^:::\s+(maskfit(?:\.\w+)*)\s*$", re.M)


def documented_modules(docs_dir):
    """Maps each module an API page renders to that page's path in docs/."""
    pages = {}
    for page in sorted(pathlib.Path(docs_dir, "api").glob("*.md")):
        for path in _DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            pages[path] = page.relative_to(docs_dir).as_posix()
    return pages


def _exported(module, name):
    """The object Python binds to `module.name` (a function over a submodule)."""
    member = module[name]
    if member.is_module and not member.is_alias and name in member.members:
        inner = member.members[name]
        if not inner.is_module:
            member = inner
    return member.final_target if member.is_alias else member


def problems(package, pages, page_ids):
    """Lists what is undocumented: no docstring, no anchor, no page."""
    found = []
    for path, page in pages.items():
        module = package if path == package.path else package[path.split(".", 1)[1]]
        if not module.is_module:
            continue
        for name in module.exports or ():
            name = getattr(name, "name", name)
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
    found = problems(package, pages, page_ids)
    if found:
        raise PluginError("Public names not documented:\n  " + "\n  ".join(found))
