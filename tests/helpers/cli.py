"""Runs experiments' command lines in a subprocess, several argvs in one."""

import json

from tests.helpers import checkout


def run(script, *args, timeout=300):
    """`python tests/scripts/<script> ARGS...` from the repository, TensorFlow quiet."""
    return checkout.run(
        checkout.script(script),
        *args,
        timeout=timeout,
        cwd=checkout.ROOT,
        TF_CPP_MIN_LOG_LEVEL="3",
    )


def outcomes(module, argvs):
    """Returns `[{"code", "output"}]`: `app.run(module.main)` for each argv."""
    done = run("usage_errors.py", module, json.dumps(argvs))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
