"""Where the tests' files are: the repository, `tests/` and its subprocess scripts."""

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)


def script(name):
    """The path of `tests/scripts/<name>`, a script the tests run in a process of its own."""
    return os.path.join(TESTS, "scripts", name)


def env(**extra):
    """This process's environment with the repository first on PYTHONPATH (and `extra`),
    for a script that imports maskfit, experiments or tests from this checkout."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env
