"""Every fenced Python example in README.md and docs/*.md runs, as written.

The examples are collected from the Markdown files. An HTML comment right
before a fence (invisible on GitHub and on the site) tells how to run it:

- `<!-- example: setup` + code + `-->`: code run first, in the example's
  namespace (imports, tiny data where the example says `x, y`, a model where
  it says `model`).
- `<!-- example: then` + code + `-->`: code run after the example (a check
  that what the page says of it holds).
- `<!-- example: continues -->`: the fence goes on from the previous Python
  fence of the file: it runs after it, in its namespace, as one example.
- `<!-- example: replace OLD NEW -->`: runs the example with the string OLD
  replaced by NEW (shell-quoted; e.g. a path the test cannot write to).
- `<!-- example: slow -->`: runs only with the `slow` tests (a long `fit`).
- `<!-- example: skip REASON -->`: not run, for the reason given (a
  multi-worker launch, a peer library that is not installed...).

`...` stands for code the reader supplies: `name = ...` keeps the `name` that
the setup defined, and a statement that only calls `f(...)` is left out.
Each example runs in a fresh temporary directory. The last line of the run
says how many examples ran and how many were skipped.
"""

import ast
import os
import re
import shlex
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = ["README.md"] + sorted(
    f"docs/{name}"
    for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md")
)
DIRECTIVES = ("setup", "then", "continues", "replace", "slow", "skip")

_FENCE = re.compile(r"^(\s*)```\s*([\w+-]*).*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*example:\s*(\w+)(.*?)(-->\s*)?$", re.S)


class Example:
    """One example: a file's Python fence, with the fences that continue it."""

    def __init__(self, path, line):
        self.path, self.line = path, line
        self.setup, self.code, self.then, self.replace = [], [], [], []
        self.slow, self.skip = False, None

    @property
    def name(self):
        return f"{self.path}:{self.line}"


def _comments_before(lines, index):
    """The HTML comments that end right above line `index`, top to bottom."""
    comments, end = [], index
    while end > 0 and lines[end - 1].rstrip().endswith("-->"):
        start = end - 1
        while "<!--" not in lines[start]:
            start -= 1
        comments.insert(0, (start + 1, "\n".join(lines[start:end])))
        end = start
    return comments


def _directives(path, lines, index):
    found = []
    for line, comment in _comments_before(lines, index):
        match = _DIRECTIVE.match(comment)
        if match is None:
            continue
        word, rest = match.group(1), match.group(2).strip()
        if word not in DIRECTIVES:
            raise ValueError(
                f"{path}:{line}: unknown example directive {word!r}; expected one"
                f" of {', '.join(DIRECTIVES)}"
            )
        found.append((line, word, rest))
    return found


def collect(path):
    """The examples of one Markdown file, in order."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    examples, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, language = fence.groups()
        end = i + 1
        while not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        if language in ("python", "py"):
            code = "\n".join(line[len(indent) :] for line in lines[i + 1 : end])
            examples = _add(path, lines, i, code, examples)
        i = end + 1
    return examples


def _add(path, lines, index, code, examples):
    directives = _directives(path, lines, index)
    words = [word for _, word, _ in directives]
    if "continues" in words:
        if not examples:
            raise ValueError(f"{path}:{index + 1}: `continues` with no example before")
        example = examples[-1]
    else:
        example = Example(path, index + 1)
        examples.append(example)
    for line, word, rest in directives:
        if word in ("setup", "then"):
            getattr(example, word).append((line + 1, rest))
        elif word == "replace":
            parts = shlex.split(rest)
            if len(parts) != 2:
                raise ValueError(
                    f"{path}:{line}: `replace` takes OLD NEW, got {rest!r}"
                )
            example.replace.append(parts)
        elif word == "slow":
            example.slow = True
        elif word == "skip":
            if not rest:
                raise ValueError(f"{path}:{line}: `skip` needs a reason")
            example.skip = rest
    example.code.append((index + 2, code))
    return examples


EXAMPLES = [example for path in FILES for example in collect(path)]
_COUNTS = {"ran": 0, "skipped": 0, "failed": 0}


def _is_placeholder_call(node):
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and [ast.dump(arg) for arg in node.value.args] == [ast.dump(ast.Constant(...))]
        and not node.value.keywords
    )


def _placeholders_out(tree, namespace, where):
    """Drops `name = ...` (keeping the setup's name) and `f(...)` statements."""
    body = []
    for node in tree.body:
        if _is_placeholder_call(node):
            continue
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and node.value.value is Ellipsis
        ):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            missing = [name for name in names if name not in namespace]
            if missing:
                raise AssertionError(
                    f"{where}: `{missing[0]} = ...` is a placeholder; give"
                    f" `{missing[0]}` a value in an `<!-- example: setup -->` comment"
                )
            continue
        body.append(node)
    tree.body = body
    return tree


def _parsed(code, path, line):
    """`code`'s syntax tree, numbered as the lines of the Markdown file."""
    tree = ast.parse(code, path)
    ast.increment_lineno(tree, line - 1)
    return tree


def run(example, namespace):
    """Runs the example's setup and code in `namespace`; raises what they raise."""
    _run_hidden(example.setup, example.path, namespace)
    for old, _ in example.replace:
        if not any(old in code for _, code in example.code):
            raise AssertionError(f"{example.name}: `replace` finds no {old!r}")
    for line, code in example.code:
        for old, new in example.replace:
            code = code.replace(old, new)
        where = f"{example.path}:{line}"
        tree = _parsed(code, example.path, line)
        tree = _placeholders_out(tree, namespace, where)
        exec(compile(tree, example.path, "exec"), namespace)
    _run_hidden(example.then, example.path, namespace)


def _run_hidden(parts, path, namespace):
    for line, code in parts:
        tree = _parsed(textwrap.dedent(code), path, line)
        exec(compile(tree, path, "exec"), namespace)


def _params():
    for example in EXAMPLES:
        marks = [pytest.mark.slow] if example.slow else []
        yield pytest.param(example, id=example.name, marks=marks)


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    start = time.perf_counter()
    yield
    if not sum(_COUNTS.values()):
        return
    line = (
        f"docs examples: {_COUNTS['ran']} ran, {_COUNTS['skipped']} skipped,"
        f" {_COUNTS['failed']} failed, of {len(EXAMPLES)} in README.md and"
        f" docs/*.md ({time.perf_counter() - start:.0f} s)"
    )
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        if hasattr(request.config, "workerinput"):
            # A pytest-xdist worker: its stderr, not its reporter, reaches the run's.
            print(
                f"\n[{request.config.workerinput['workerid']}] {line}", file=sys.stderr
            )
        elif reporter is not None:
            reporter.write_line("\n" + line)


@pytest.mark.parametrize("example", _params())
def test_example_runs(example, tmp_path, monkeypatch):
    if example.skip:
        _COUNTS["skipped"] += 1
        pytest.skip(f"marked in {example.name}: {example.skip}")
    monkeypatch.chdir(tmp_path)
    try:
        run(example, {"__name__": "docs_example"})
    except pytest.skip.Exception:  # its setup found the installed versions lacking
        _COUNTS["skipped"] += 1
        raise
    except BaseException:
        _COUNTS["failed"] += 1
        raise
    _COUNTS["ran"] += 1


def test_examples_are_found_and_their_markers_parse():
    # collect() raised at import for a malformed marker; an empty list would
    # mean the fences were not found at all.
    assert len(EXAMPLES) >= 20, [example.name for example in EXAMPLES]
    assert all(example.code for example in EXAMPLES)


def test_a_marker_must_sit_right_above_a_python_fence(tmp_path):
    for path in FILES:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            lines = f.read().split("\n")
        for index, line in enumerate(lines):
            if not _DIRECTIVE.match(line):
                continue
            end = index
            while not lines[end].rstrip().endswith("-->"):
                end += 1
            following = lines[end + 1] if end + 1 < len(lines) else ""
            fence = _FENCE.match(following)
            attached = fence is not None and fence.group(2) in ("python", "py")
            attached = attached or _DIRECTIVE.match(following) is not None
            assert attached, (
                f"{path}:{index + 1}: an example marker must be followed by a"
                " ```python fence (or another marker), not by"
                f" {following!r}"
            )


def test_the_runner_fails_a_broken_example_and_fills_placeholders():
    broken = Example("broken.md", 1)
    broken.code.append((2, "import maskfit\nmaskfit.no_such_name"))
    with pytest.raises(AttributeError):
        run(broken, {})
    placeholder = Example("placeholder.md", 1)
    placeholder.setup.append((1, "model = 3"))
    placeholder.code.append((2, "model = ...\nprint(...)\ntotal = model + 1"))
    namespace = {}
    run(placeholder, namespace)
    assert namespace["total"] == 4
    unset = Example("unset.md", 1)
    unset.code.append((2, "model = ..."))
    with pytest.raises(AssertionError, match="placeholder"):
        run(unset, {})
