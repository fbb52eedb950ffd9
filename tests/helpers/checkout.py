"""Where the tests' files are: the repository, `tests/` and its subprocess scripts."""

import os
import subprocess
import sys

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


def run(path, *args, timeout=300, cwd=None, **extra):
    """`python path args...` in a process of its own (`env(**extra)`), output captured."""
    return subprocess.run(
        [sys.executable, path, *map(str, args)],
        env=env(**extra),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
