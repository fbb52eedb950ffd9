"""Offline text for the finetune_recipes experiment, as byte tokens.

Pretraining: Python's own documentation (`pydoc_data.topics`) and the
standard library's top-level modules, as next-byte prediction. Downstream task:
which standard-library package (email, asyncio, xml...) a snippet of source
comes from; the package's files are split between training and test, so no
test snippet shares a file with a training one. Everything is read from the
installed Python: no download.
"""

import os
import sysconfig

import numpy as np

__all__ = ["PACKAGES", "VOCABULARY", "pretraining_windows", "snippet_task"]

# Byte values 1..255 are shifted by one; 0 is padding.
VOCABULARY = 257
PACKAGES = ("asyncio", "email", "importlib", "multiprocessing", "tkinter", "xml")


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
    """`(x_train, y_train, x_test, y_test)`: snippets and their package's index.

    Each package's files alternate between the training and the test side;
    snippets are windows of `length` bytes at random places in them.
    """
    rng = np.random.default_rng(seed)
    sides = ([], [], [], [])
    for label, package in enumerate(PACKAGES):
        files = _package_files(package)
        for side, chosen, count in (
            (0, files[0::2], train_per_class),
            (2, files[1::2], test_per_class),
        ):
            stream = _tokens("\n".join(_read(p) for p in chosen))
            starts = rng.integers(0, len(stream) - length, count)
            sides[side].append(np.stack([stream[s : s + length] for s in starts]))
            sides[side + 1].append(np.full(count, label, "int32"))
    x_train, y_train, x_test, y_test = (np.concatenate(s) for s in sides)
    order = rng.permutation(len(y_train))
    return x_train[order], y_train[order], x_test, y_test
