"""Offline text for the finetune_recipes experiment, as byte tokens.

Pretraining: Python's own documentation (`pydoc_data.topics`) and the
standard library's top-level modules, as next-byte prediction. Downstream task:
is a snippet code, a docstring or a comment? The snippets come from the
standard library's packages (asyncio, email, http, ...), which pretraining
never reads; docstrings lose their indentation and comments their `#`, so
neither is told by its first byte. Each package file goes wholly to the
training or the test side. Everything is read from the installed Python: no
download.
"""

import ast
import io
import os
import sysconfig
import tokenize

import numpy as np

__all__ = ["CLASSES", "PACKAGES", "VOCABULARY", "pretraining_windows", "snippet_task"]

# Byte values 1..255 are shifted by one; 0 is padding.
VOCABULARY = 257
CLASSES = ("code", "docstring", "comment")
PACKAGES = (
    "asyncio",
    "collections",
    "concurrent",
    "ctypes",
    "curses",
    "dbm",
    "email",
    "html",
    "http",
    "importlib",
    "json",
    "logging",
    "multiprocessing",
    "re",
    "sqlite3",
    "tkinter",
    "tomllib",
    "unittest",
    "urllib",
    "venv",
    "wsgiref",
    "xml",
    "xmlrpc",
    "zoneinfo",
)


def _stdlib():
    return sysconfig.get_paths()["stdlib"]


def _tokens(text):
    return np.frombuffer(text.encode("utf-8", "replace"), np.uint8).astype("int32") + 1


def _package_files(package):
    files = []
    for root, dirs, names in os.walk(os.path.join(_stdlib(), package)):
        dirs[:] = sorted(d for d in dirs if "test" not in d and d != "__pycache__")
        files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
    return files


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _split(source):
    """`(code, docstrings, comments)` of one file; None if it does not parse."""
    try:
        tree = ast.parse(source)
        comments = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, tokenize.TokenError):
        return None
    docstrings, dropped = [], set()
    for node in ast.walk(tree):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docstring = isinstance(node, kinds) and ast.get_docstring(node)
        if docstring:
            docstrings.append(docstring)
            dropped.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    comments = [t for t in comments if t.type == tokenize.COMMENT]
    dropped.update(t.start[0] for t in comments if t.line.lstrip().startswith("#"))
    code = [
        line
        for number, line in enumerate(source.splitlines(), 1)
        if number not in dropped and line.strip()
    ]
    return (
        "\n".join(code),
        "\n".join(docstrings),
        "\n".join(t.string.lstrip("#").strip() for t in comments),
    )


def pretraining_windows(count, length, seed):
    """`count` windows of `length + 1` byte tokens from the pretraining text."""
    import pydoc_data.topics

    parts = list(pydoc_data.topics.topics.values())
    top = sorted(n for n in os.listdir(_stdlib()) if n.endswith(".py"))
    parts += [_read(os.path.join(_stdlib(), n)) for n in top]
    stream = _tokens("\n".join(parts))
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - length - 1, count)
    return np.stack([stream[s : s + length + 1] for s in starts])


def snippet_task(train_per_class, test_per_class, length, seed):
    """`(x_train, y_train, x_test, y_test)`: snippets and their index in `CLASSES`.

    The packages' files alternate between the training and the test side;
    each class's text on a side is joined, and snippets are windows of
    `length` bytes at random places in it.
    """
    rng = np.random.default_rng(seed)
    files = [f for package in PACKAGES for f in _package_files(package)]
    texts = ([[] for _ in CLASSES], [[] for _ in CLASSES])
    for i, path in enumerate(files):
        parts = _split(_read(path))
        for label, part in enumerate(parts or ()):
            if part:
                texts[i % 2][label].append(part)
    sides = ([], [], [], [])
    for label in range(len(CLASSES)):
        for side, count in ((0, train_per_class), (1, test_per_class)):
            stream = _tokens("\n".join(texts[side][label]))
            starts = rng.integers(0, len(stream) - length, count)
            sides[2 * side].append(np.stack([stream[s : s + length] for s in starts]))
            sides[2 * side + 1].append(np.full(count, label, "int32"))
    x_train, y_train, x_test, y_test = (np.concatenate(s) for s in sides)
    order = rng.permutation(len(y_train))
    return x_train[order], y_train[order], x_test, y_test
