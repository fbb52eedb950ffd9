"""Runs experiments' command lines in a subprocess, several argvs in one."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SCRIPT = os.path.join(ROOT, "tests", "scripts", "usage_errors.py")


def outcomes(module, argvs):
    """Returns `[{"code", "output"}]`: `app.run(module.main)` for each argv."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, _SCRIPT, module, json.dumps(argvs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
