"""Interrupted runs resume exactly with keras.callbacks.BackupAndRestore."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers import checkout

SCRIPT = checkout.script("resume_run.py")


def start(phase, workdir, variant="masks"):
    return subprocess.Popen(
        [sys.executable, SCRIPT, phase, str(workdir), variant],
        env=checkout.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish(process, timeout=180):
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, output.decode(errors="replace")[-3000:]


def weights(path):
    with np.load(path) as arrays:
        return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def assert_frozen_unchanged(initial, final):
    body_kernel, body_bias, head_kernel, head_bias = 0, 1, 2, 3
    np.testing.assert_array_equal(final[head_kernel][:, 1], initial[head_kernel][:, 1])
    np.testing.assert_array_equal(final[head_bias][1], initial[head_bias][1])
    # Body unit 3 is frozen in both intervals of its schedule.
    np.testing.assert_array_equal(final[body_kernel][:, 3], initial[body_kernel][:, 3])
    np.testing.assert_array_equal(final[body_bias][3], initial[body_bias][3])


def run_interrupted(tmp_path, variant):
    """Runs the phases of resume_run.py; returns the workdirs (a kill included)."""
    dirs = {name: tmp_path / name for name in ("full", "killed", "raised")}
    for d in dirs.values():
        d.mkdir()
    full = start("full", dirs["full"], variant)
    raised = start("raise", dirs["raised"], variant)
    hung = start("hang", dirs["killed"], variant)
    try:
        deadline = time.monotonic() + 180
        while not (dirs["killed"] / "waiting").exists():
            assert hung.poll() is None, hung.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "the run never reached its stop step"
            time.sleep(0.2)
        assert (dirs["killed"] / "backup").exists()  # epoch 1 was backed up
        os.killpg(hung.pid, signal.SIGKILL)
        hung.wait(timeout=30)
    finally:
        if hung.poll() is None:
            os.killpg(hung.pid, signal.SIGKILL)
            hung.wait()
    finish(full)
    finish(raised)
    finish(start("resume", dirs["killed"], variant))
    return dirs


def resumed_as_uninterrupted(tmp_path, variant):
    """Runs `variant` whole, raised and killed; asserts both resumed runs end with
    the whole run's weights, bit for bit; returns the folders and those weights."""
    dirs = run_interrupted(tmp_path, variant)
    reference = weights(dirs["full"] / "weights_full.npz")
    assert_same(weights(dirs["raised"] / "weights_raise.npz"), reference)
    assert_same(weights(dirs["killed"] / "weights_resume.npz"), reference)
    return dirs, reference


@pytest.mark.slow  # worker processes, killed and resumed
def test_killed_and_raising_runs_resume_bit_identical(tmp_path):
    dirs, reference = resumed_as_uninterrupted(tmp_path, "masks")
    assert_frozen_unchanged(weights(dirs["full"] / "initial.npz"), reference)
    # The restarted runs did only what was left: epochs 3 and 4 of 4 steps.
    assert (dirs["full"] / "steps_full.txt").read_text() == "16"
    assert (dirs["killed"] / "steps_resume.txt").read_text() == "8"
    assert (dirs["raised"] / "steps_raise.txt").read_text() == "8"


@pytest.mark.slow  # worker processes, killed and resumed
def test_pruned_runs_resume_bit_identical_keep_masks_included(tmp_path):
    dirs, reference = resumed_as_uninterrupted(tmp_path, "pruning")
    body_kernel, head_kernel, body_keep, head_keep = 0, 2, 4, 5
    assert len(reference) == 6  # 4 weights, 2 keep masks
    for kernel, keep in ((body_kernel, body_keep), (head_kernel, head_keep)):
        np.testing.assert_array_equal(reference[kernel][~reference[keep]], 0.0)
    assert np.count_nonzero(~reference[body_keep]) == 24 * 3 // 4
    # Head output 1 is frozen by its mask: never pruned, never moved; so only
    # output 0's 8 entries can go (the schedule asks for 12 of 16).
    initial = weights(dirs["full"] / "initial.npz")
    np.testing.assert_array_equal(
        reference[head_kernel][:, 1], initial[head_kernel][:, 1]
    )
    assert not reference[head_keep][:, 0].any() and reference[head_keep][:, 1].all()
    assert (dirs["killed"] / "steps_resume.txt").read_text() == "8"
