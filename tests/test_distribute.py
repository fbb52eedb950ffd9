"""Frozen entries stay exact under MirroredStrategy and MultiWorkerMirroredStrategy.

The distributed runs need TensorFlow set up differently (two logical CPUs,
collective ops across processes), so they happen in subprocesses running
`distributed_runs.py`; these tests start them with a bounded time, always
stop them, and check the weights they saved.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from experiments import common
from maskfit import distribute
from tests.helpers import checkout, distributed_runs

SCRIPT = distributed_runs.__file__
TIMEOUT_S = 180
# How closely a run on several replicas follows the single-device run.
TOLERANCE = {
    "float32": dict(rtol=1e-5, atol=1e-6),
    "mixed_float16": dict(rtol=1e-2, atol=2e-3),
    "mixed_bfloat16": dict(rtol=5e-2, atol=1e-2),
}


def _env(**extra):
    return checkout.env(TF_CPP_MIN_LOG_LEVEL="2", **extra)


def _tail(path, lines=40):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def _stop(process):
    """Kills `process` and everything it started, if it still runs."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _load(directory, name):
    with np.load(os.path.join(directory, name + ".npz")) as f:
        return dict(f)


def _variables(result):
    return sorted(k.split("/", 1)[1] for k in result if k.startswith("before/"))


def _replica_values(result, path):
    """The values of variable `path` after training, one per local replica."""
    keys = [k for k in result if k.startswith("after/") and k.endswith("/" + path)]
    assert keys, f"No values saved for {path}"
    return [result[k] for k in sorted(keys)]


def _wait_all(processes, timeout):
    """Waits for all; returns their exit codes, or "timeout" / "stopped".

    Stops waiting as soon as one fails: a worker whose peer died would wait
    for it until the deadline.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in processes]
        if None not in codes or any(c not in (None, 0) for c in codes):
            return ["stopped" if c is None else c for c in codes]
        time.sleep(0.2)
    return ["timeout" if p.poll() is None else p.returncode for p in processes]


def _start(out, name, args, env):
    log = out / f"{name}.txt"
    with open(log, "w") as f:
        process = subprocess.Popen(
            [sys.executable, SCRIPT, *args],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return name, process, log


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """Runs the mirrored runs and two workers on 127.0.0.1, side by side.

    One process trains every mirrored run and its single-device twin; two more
    are the workers of a MultiWorkerMirroredStrategy cluster. All share one
    deadline and are killed, with anything they started, however this ends.
    """
    out = tmp_path_factory.mktemp("runs")
    cluster = {"worker": [f"127.0.0.1:{port}" for port in _free_ports(2)]}
    started = []
    try:
        started.append(_start(out, "mirrored", ["mirrored", str(out)], _env()))
        for index in range(2):
            config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            env = _env(TF_CONFIG=json.dumps(config))
            started.append(_start(out, f"worker{index}", ["worker", str(out)], env))
        codes = _wait_all([process for _, process, _ in started], TIMEOUT_S)
    finally:
        for _, process, _ in started:
            _stop(process)
    failed = [
        f"--- {name} ({code}):\n{_tail(log)}"
        for (name, _, log), code in zip(started, codes)
        if code != 0
    ]
    if failed:
        pytest.fail("Distributed runs failed:\n" + "\n".join(failed))
    return str(out)


# The helpers experiments use.


def test_make_strategy_rejects_unknown_names():
    with pytest.raises(ValueError, match="'default', 'mirrored', 'multi_worker'"):
        distribute.make_strategy("tpu")


def test_make_strategy_default_is_the_current_strategy():
    assert distribute.make_strategy("default") is tf.distribute.get_strategy()


@pytest.mark.parametrize(
    "name, devices", [("default", 2), ("mirrored", 0), ("mirrored", True)]
)
def test_make_strategy_checks_logical_devices(name, devices):
    with pytest.raises(ValueError, match="logical_devices"):
        distribute.make_strategy(name, logical_devices=devices)


def test_set_precision_validates_and_returns_the_previous_policy():
    with pytest.raises(ValueError, match="'mixed_float16'"):
        distribute.set_precision("float16")
    assert distribute.set_precision("mixed_bfloat16") == "float32"
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert distribute.set_precision("float32") == "mixed_bfloat16"


def test_scale_flags_parse_and_validate():
    flag_values = flags.FlagValues()
    strategy, precision = common.define_scale_flags(flag_values)
    flag_values(["prog"])
    assert (strategy.value, precision.value) == ("default", "float32")
    flag_values(["prog", "--strategy=multi_worker", "--precision=mixed_float16"])
    assert (flag_values.strategy, flag_values.precision) == (
        "multi_worker",
        "mixed_float16",
    )
    with pytest.raises(flags.IllegalFlagValueError):
        flag_values(["prog", "--strategy=tpu"])


def test_is_chief_on_one_machine():
    assert distribute.is_chief()
    assert distribute.is_chief(distribute.make_strategy("default"))
    assert distribute.is_chief(distribute.make_strategy("mirrored"))


# MirroredStrategy over two logical CPUs.


@pytest.mark.parametrize("run", sorted(distributed_runs.MIRRORED_RUNS))
def test_mirrored_frozen_entries_hold_on_every_replica(runs_dir, run):
    result = _load(runs_dir, f"{run}-mirrored")
    assert int(result["replicas"]) == 2
    distributed_runs.assert_frozen_and_learning(result)
    for path in _variables(result):
        first, second = _replica_values(result, path)
        np.testing.assert_array_equal(first, second, err_msg=path)


@pytest.mark.parametrize("run", sorted(distributed_runs.MIRRORED_RUNS))
def test_mirrored_matches_the_single_device_run(runs_dir, run):
    policy = distributed_runs.MIRRORED_RUNS[run][2]
    single = _load(runs_dir, f"{run}-default")
    mirrored = _load(runs_dir, f"{run}-mirrored")
    distributed_runs.assert_frozen_and_learning(single)
    for path in _variables(single):
        np.testing.assert_allclose(
            _replica_values(mirrored, path)[0],
            _replica_values(single, path)[0],
            err_msg=path,
            **TOLERANCE[policy],
        )
    np.testing.assert_allclose(mirrored["loss"], single["loss"], **TOLERANCE[policy])
    scaled = str(mirrored["optimizer"]) == "LossScaleOptimizer"
    assert scaled == (policy == "mixed_float16")


def test_mirrored_logged_loss_and_weights_match_stock_keras(runs_dir):
    stock = _load(runs_dir, "unmasked_loss-stock")
    masked = _load(runs_dir, "unmasked_loss-masked")
    np.testing.assert_allclose(masked["loss"], stock["loss"], rtol=1e-6)
    for path in _variables(stock):
        np.testing.assert_allclose(
            _replica_values(masked, path)[0],
            _replica_values(stock, path)[0],
            rtol=1e-6,
            atol=1e-7,
            err_msg=path,
        )


# MultiWorkerMirroredStrategy: two processes on 127.0.0.1.


@pytest.mark.parametrize("run", sorted(distributed_runs.WORKER_RUNS))
def test_workers_hold_frozen_entries_and_agree(runs_dir, run):
    workers = [_load(runs_dir, f"{run}-worker{i}") for i in range(2)]
    policy = distributed_runs.WORKER_RUNS[run][2]
    single = _load(runs_dir, f"{run}-default")
    for result in workers:
        assert int(result["replicas"]) == 2
        distributed_runs.assert_frozen_and_learning(result)
    assert [bool(result["chief"]) for result in workers] == [True, False]
    for path in _variables(single):
        (first,), (second,) = (_replica_values(w, path) for w in workers)
        np.testing.assert_array_equal(first, second, err_msg=path)
        np.testing.assert_allclose(
            first, _replica_values(single, path)[0], err_msg=path, **TOLERANCE[policy]
        )
    np.testing.assert_allclose(workers[0]["loss"], single["loss"], **TOLERANCE[policy])
