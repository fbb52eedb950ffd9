"""griffe extensions: how maskfit's docstrings read on the site.

`DoctestFences` shows the doctest examples as Python code:

maskfit's docstrings put their doctests after an `Example:` line, unindented,
which the Google-style parser leaves as plain Markdown: `>>>` would render as
nested quotes and an output such as `[(0, 1.0, ('head',))]` as a link. This
wraps each unindented doctest (its `>>>` line to the next blank line, output
included) in a ```pycon fence before the docstring is parsed. Indented
`Example:` sections are left to the parser, which already renders them as code.
It also joins an `Args:` entry whose names run over several lines
("delta_t, alpha,\n  seed: as for RigL") into one line, as the parser expects.
`ImportedOverSubmodule` documents `maskfit.summary` as Python resolves it.
"""

import re

import griffe

# An Args entry's line that holds only parameter names, ending with a comma:
# the entry's names continue on the next line.
_NAMES_CONTINUE = re.compile(r"^(\s+)\w+(, \w+)*,$")


def join_name_lists(text):
    """Returns `text` with each Args entry's names list joined onto one line."""
    lines, out = text.split("\n"), []
    for line in lines:
        previous = out[-1] if out else ""
        match = _NAMES_CONTINUE.match(previous)
        if match and line.startswith(match.group(1)) and line.strip():
            out[-1] = previous + " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out)


def fence_doctests(text):
    """Returns `text` with every unindented doctest run wrapped in a pycon fence."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        if not lines[i].startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].strip():
            end += 1
        out += ["```pycon", *lines[i:end], "```"]
        i = end
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fences the doctests (and joins Args name lists) of every docstring."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            text = join_name_lists(obj.docstring.value)
            obj.docstring.value = fence_doctests(text) if ">>>" in text else text


class ImportedOverSubmodule(griffe.Extension):
    """Documents `maskfit.summary` as the function, as Python resolves it.

    `from maskfit.summary import summary` in a package's `__init__` rebinds the
    package attribute `summary` from the submodule to the function; griffe
    keeps the submodule there, which would leave the function out of the API
    page. For each exported name bound to a submodule that defines the same
    name, this points the package member at that object, as Python does.
    """

    def on_package(self, *, pkg, **kwargs):
        for module in _modules(pkg):
            for name in module.exports or ():
                name = getattr(name, "name", name)
                member = module.members.get(name)
                if member is None or member.is_alias or not member.is_module:
                    continue
                inner = member.members.get(name)
                if inner is not None and not inner.is_module:
                    target = inner.final_target if inner.is_alias else inner
                    module.set_member(name, griffe.Alias(name, target, parent=module))


def _modules(module):
    yield module
    for member in module.members.values():
        if not member.is_alias and member.is_module:
            yield from _modules(member)
