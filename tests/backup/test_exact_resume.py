"""Runs killed with SIGKILL at any step resume to the same model, bit for bit.

tests/scripts/exact_resume_run.py trains each case of its `CASES` (masks, a
`PiecewiseMask` boundary and a pruning schedule crossing the kill points, AdamW
with weight decay and a learning-rate schedule, dropout) once without a backup
callback, and once with `maskfit.ExactBackupAndRestore(save_freq=4)`, killing
itself inside an epoch, at an epoch's last step and while writing a backup; a
chain of restarts here brings each case to its end. The single-device runs and
the MirroredStrategy runs (two logical CPUs) go side by side, and so do the
script's `JAX_CASES` under KERAS_BACKEND=jax (eager and jitted steps): this
TensorFlow test starts those processes on JAX, so the slow tests check both.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers import checkout

# Worker processes killed and restarted, every case: minutes. `.ci/run` runs
# them; test_exact_backup.py resumes inside an epoch in one process, quickly.
pytestmark = pytest.mark.slow

SCRIPT = checkout.script("exact_resume_run.py")
DEADLINE_S = 900

_spec = importlib.util.spec_from_file_location("exact_resume_run", SCRIPT)
run_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_script)
ALL_CASES = {**run_script.CASES, **run_script.MIRRORED_CASES, **run_script.JAX_CASES}


class _Chain:
    """Runs the script, and runs it again each time it was killed, until it ends."""

    def __init__(self, args, restarts, **env):
        self.args, self.restarts, self.env = args, restarts, env
        self.outputs, self.process, self.returncode = [], None, None
        self._start()

    def _start(self):
        self.process = subprocess.Popen(
            [sys.executable, SCRIPT] + self.args,
            env=checkout.env(TF_CPP_MIN_LOG_LEVEL="2", **self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def poll(self):
        """Returns True once the chain has ended."""
        if self.returncode is not None:
            return True
        if self.process.poll() is None:
            return False
        self.outputs.append(self.process.stdout.read().decode(errors="replace"))
        code = self.process.returncode
        if code == -signal.SIGKILL and len(self.outputs) <= self.restarts:
            self._start()
            return False
        self.returncode = code
        return True

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def output(self):
        return "\n".join(self.outputs)


def _kills(cases):
    return sum(
        len(c.get("kills", [])) + len(c.get("write_kills", [])) for c in cases.values()
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("exact_resume"))
    chains = {
        "reference": _Chain(["reference", workdir], restarts=0),
        "resume": _Chain(["resume", workdir], restarts=_kills(run_script.CASES)),
        "mirrored": _Chain(
            ["resume+reference", workdir, "mirrored"],
            restarts=_kills(run_script.MIRRORED_CASES),
        ),
        "jax": _Chain(
            ["resume+reference", workdir],
            restarts=_kills(run_script.JAX_CASES),
            KERAS_BACKEND="jax",
        ),
    }
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not all([chain.poll() for chain in chains.values()]):
            assert time.monotonic() < deadline, "the runs did not end in time"
            time.sleep(0.2)
    finally:
        for chain in chains.values():
            chain.stop()
    for name, chain in chains.items():
        assert chain.returncode == 0, f"{name}:\n{chain.output()[-4000:]}"
    output = "".join(chains[n].output() for n in ("resume", "mirrored", "jax"))
    return workdir, output


def _load(workdir, name, phase):
    with np.load(os.path.join(workdir, f"{name}.{phase}.npz")) as arrays:
        return {key: arrays[key] for key in arrays.files}


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_restarts_resume_from_the_newest_complete_backup(runs, name):
    _, output = runs
    prefix = f"resuming {name} "
    lines = [line.split() for line in output.splitlines() if line.startswith(prefix)]
    assert [int(words[3]) for words in lines] == ALL_CASES[name]["resumes"]
    if ALL_CASES[name].get("write_kills"):
        # The write was killed with the new backup's folder half done.
        after_write_kill = lines[-1]
        assert any(".partial-" in word for word in after_write_kill), after_write_kill


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_resumed_run_ends_bit_identical(runs, name):
    workdir, _ = runs
    reference = _load(workdir, name, "reference")
    resumed = _load(workdir, name, "resumed")
    assert sorted(reference) == sorted(resumed)
    assert int(resumed["optimizer_0"]) == run_script.EPOCHS * 10  # iterations
    for key in sorted(reference):
        if key != "logs":  # every weight and optimizer variable, pruned slots too
            np.testing.assert_array_equal(resumed[key], reference[key], key)
    # The metrics of the interrupted epoch continue: the last epoch's logs too.
    np.testing.assert_allclose(
        list(json.loads(str(resumed["logs"])).values()),
        list(json.loads(str(reference["logs"])).values()),
        rtol=1e-6,
    )


def test_inputs_it_resumes_exactly_get_no_warning(runs):
    _, output = runs
    assert "cannot resume this input" not in output
