"""Tests for experiments/learnable_scale{,_lib}.py: a tiny run, the default, the CLI."""

import dataclasses
import glob
import json
import logging
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import app, flags
from absl.testing import flagsaver

from experiments import common
from experiments.learnable_scale import __main__ as learnable_scale
from experiments.learnable_scale.lib import Config, run
from tests.helpers import experiment_checks as checks

# 8 steps an epoch, run 3 at a time: the last call of each epoch is short.
TINY = Config(
    samples=256, batch_size=32, epochs=3, learning_rate=0.01, steps_per_execution=3
)


def read_scalars(workdir):
    """Returns {tag: [(step, value), ...]} from the run's event files."""
    scalars = {}
    for path in glob.glob(os.path.join(workdir, "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor)))
                )
    return scalars


def test_tiny_run_writes_config_metrics_and_events(tmp_path):
    workdir = str(tmp_path / "run")
    metrics = run(TINY, workdir)

    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f) == dataclasses.asdict(TINY)
    with open(os.path.join(workdir, "metrics.json")) as f:
        written = json.load(f)
    assert written == metrics
    assert set(metrics) >= {"scale", "loss", "losses", "scales", "wall_seconds"}
    assert len(metrics["losses"]) == len(metrics["scales"]) == TINY.epochs
    assert metrics["steps"] == TINY.epochs * TINY.samples // TINY.batch_size
    # Moves from 2.0 towards 2.5 without passing it, and the loss falls.
    assert 2.0 < metrics["scales"][0] < metrics["scale"] < 2.5
    assert metrics["losses"] == sorted(metrics["losses"], reverse=True)

    scalars = read_scalars(workdir)
    epochs = list(range(1, TINY.epochs + 1))
    for tag, values in (("loss", metrics["losses"]), ("scale", metrics["scales"])):
        assert [step for step, _ in scalars[tag]] == epochs
        assert [value for _, value in scalars[tag]] == pytest.approx(values)


def test_default_config_learns_2_5(tmp_path):
    metrics = run(Config(), str(tmp_path))
    np.testing.assert_allclose(metrics["scale"], 2.5, atol=1e-3)
    assert metrics["steps"] == 10 * 100_000 // 32  # The seed's 31250 steps.


test_config_rejects_invalid_values = checks.config_rejects_test(
    Config,
    [
        ("samples", 0, "positive integer"),
        ("batch_size", -1, "positive integer"),
        ("epochs", 1.5, "positive integer"),
        ("steps_per_execution", True, "positive integer"),
        ("learning_rate", 0.0, "positive number"),
        ("learning_rate", float("nan"), "positive number"),
        ("x_value", float("inf"), "finite number"),
        ("optimizer", "nope", "expected one of .*sgd"),
        ("seed", -1, "non-negative integer"),
        ("strategy", "tpu", "expected one of 'default'"),
        ("precision", "float16", "expected one of 'float32'"),
    ],
    received="Received: {field}=",
)


@pytest.mark.parametrize(
    "changes, fix",
    [
        ({}, "Pass --steps_per_execution=1 --nojit_compile."),
        ({"steps_per_execution": 1}, "Pass --nojit_compile."),
        ({"jit_compile": False}, "Pass --steps_per_execution=1."),
    ],
)
def test_config_refuses_what_keras_fails_under_a_strategy(changes, fix):
    with pytest.raises(ValueError, match=re.escape(fix)):
        Config(strategy="mirrored", **changes)


@pytest.mark.parametrize(
    "strategy, precision", [("mirrored", "float32"), ("default", "mixed_float16")]
)
def test_tiny_run_under_a_strategy_or_a_mixed_precision(tmp_path, strategy, precision):
    config = dataclasses.replace(
        TINY,
        steps_per_execution=1,
        jit_compile=False,
        strategy=strategy,
        precision=precision,
    )
    workdir = str(tmp_path / "run")
    metrics = run(config, workdir)
    with open(os.path.join(workdir, "metrics.json")) as f:
        assert json.load(f) == metrics
    assert set(read_scalars(workdir)) == {"loss", "scale"}
    assert 2.0 < metrics["scales"][0] < metrics["scale"] < 2.5
    assert keras.config.dtype_policy().name == "float32"  # Restored.


def test_config_accepts_any_case_of_optimizer_names():
    assert {"sgd", "adam", "adamw", "rmsprop"} <= set(common.OPTIMIZERS)
    Config(optimizer="SGD")


_BAD_FLAGS = [
    ("--learning_rate=0", "Received: learning_rate=0.0"),
    ("--optimizer=nope", "adagrad, adam, adamax, adamw, "),
]


def test_cli_rejects_bad_flags_before_writing(tmp_path):
    # The command line as a user runs it, every case in one process.
    checks.assert_cli_refuses_bad_flags("learnable_scale", _BAD_FLAGS, tmp_path)


@pytest.mark.parametrize("flag", ["--strategy=tpu", "--precision=float16"])
def test_flags_reject_unknown_strategy_and_precision(flag):
    with flagsaver.flagsaver():
        with pytest.raises(flags.IllegalFlagValueError, match="should be one of"):
            learnable_scale.FLAGS(["learnable_scale", flag, "--workdir=unused"])


def test_main_refuses_a_strategy_with_the_default_execution(tmp_path):
    workdir = tmp_path / "run"
    argv = ["learnable_scale", "--strategy=mirrored", f"--workdir={workdir}"]
    with flagsaver.flagsaver():
        learnable_scale.FLAGS(argv)
        with pytest.raises(
            app.UsageError, match="--steps_per_execution=1 --nojit_compile"
        ):
            learnable_scale.main(argv[:1])
    assert not workdir.exists()


def test_main_turns_flags_into_config_and_logs_each_epoch(tmp_path, caplog):
    # In-process: the subprocess tests above already cover app.run(main).
    workdir = tmp_path / "run"
    argv = [
        "learnable_scale",
        "--samples=64",
        "--epochs=2",
        "--optimizer=adam",
        "--nojit_compile",
        f"--workdir={workdir}",
    ]
    caplog.set_level(logging.INFO)
    with flagsaver.flagsaver():
        learnable_scale.FLAGS(argv)
        learnable_scale.main(argv[:1])
    assert "epoch 2 loss" in caplog.text
    with open(workdir / "config.json") as f:
        config = json.load(f)
    assert config == dataclasses.asdict(
        dataclasses.replace(
            Config(),
            samples=64,
            epochs=2,
            optimizer="adam",
            jit_compile=False,
        )
    )
    assert (workdir / "metrics.json").exists()
