"""The text both arms learn: Python's own documentation and source, as bytes.

`pydoc_data.topics` (the help text of every keyword and topic) and a fixed
list of standard-library modules, joined in a fixed order and read as
bytes (256 tokens, no tokenizer). The last `held_out` fraction of the
byte stream is the validation text. `Corpus.batches(steps, batch, seed)`
draws every training window of a run up front from a seed, so the Keras
arm and the PyTorch arm see the same tokens in the same order. Nothing is
downloaded; the Python version and a SHA-256 of the text are recorded,
since another Python ships other text.
"""

import hashlib
import os
import platform
import sysconfig

import numpy as np

__all__ = ["FILES", "VOCABULARY", "Corpus", "load"]

VOCABULARY = 256
# Modules present in every Python from 3.9 on (a missing one is skipped
# and left out of `Corpus.files`).
FILES = (
    "argparse.py",
    "ast.py",
    "bisect.py",
    "calendar.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "heapq.py",
    "inspect.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "random.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
    "typing.py",
)


class Corpus:
    """Training and validation bytes, with what made them.

    Attributes:
      train, validation: int32 token arrays (byte values).
      files: the standard-library files read, in order.
      sha256: hash of the whole text (documentation, then files).
      python: the Python version that shipped it.
    """

    def __init__(self, text, files, held_out):
        data = text.encode("utf-8", "replace")
        tokens = np.frombuffer(data, np.uint8).astype(np.int32)
        cut = int(len(tokens) * (1.0 - held_out))
        self.train, self.validation = tokens[:cut], tokens[cut:]
        self.files = tuple(files)
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.python = platform.python_version()

    def describe(self):
        """What config.json records about the text."""
        return {
            "python": self.python,
            "sha256": self.sha256,
            "files": list(self.files),
            "train_tokens": int(len(self.train)),
            "validation_tokens": int(len(self.validation)),
        }

    def batches(self, steps, batch_size, length, seed):
        """`(steps, batch_size, length + 1)` training windows, drawn from `seed`."""
        rng = np.random.default_rng(seed)
        starts = rng.integers(0, len(self.train) - length - 1, (steps, batch_size))
        return self.train[starts[..., None] + np.arange(length + 1)]

    def validation_windows(self, count, length):
        """Up to `count` consecutive, non-overlapping windows of `length + 1` tokens."""
        count = min(count, (len(self.validation) - 1) // length)
        starts = np.arange(count) * length
        return self.validation[starts[:, None] + np.arange(length + 1)]


def load(held_out=0.1):
    """Reads the corpus from the running Python's documentation and standard library."""
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    parts = [topics[key] for key in sorted(topics)]
    stdlib = sysconfig.get_paths()["stdlib"]
    files = []
    for name in FILES:
        path = os.path.join(stdlib, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
            files.append(name)
    return Corpus("\n".join(parts), files, held_out)
