"""Checks every experiment's tests make: its command line and its optional extras."""

import glob
import logging
import os
import sys

import pytest
import tensorflow as tf


# The structured-pruning run at its tiniest, shared by experiments.structured_pruning
# and benchmarks.structured_vs_torch_pruning (their configs take these fields).
TINY_STRUCTURED = dict(
    datasets=("digits",),
    seeds=(0,),
    batch_size=32,
    epochs=1,
    prune_epochs=1,
    prune_steps=2,
    finetune_epochs=1,
    mlp_hidden=(32, 32),
    resnet_widths=(16, 32),
    latency_rounds=1,
    round_seconds=0.001,
    threads=(0, 0),
    max_train_examples=64,
)


def bad_flag_argvs(experiment, flags, tmp_path):
    """One argv per flag of `flags`, each with a workdir of its own (0, 1, ...)."""
    return [
        [experiment, flag, f"--workdir={tmp_path / str(index)}"]
        for index, flag in enumerate(flags)
    ]


def assert_figure_skipped_without_matplotlib(figure, path, monkeypatch, caplog):
    """`figure(path)` returns None and warns without matplotlib, and writes nothing."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with caplog.at_level(logging.WARNING):
        assert figure(path) is None
    assert "matplotlib is not installed" in caplog.text
    assert not os.path.exists(path)


def assert_run_needs_scikit_learn(run, config, tmp_path, monkeypatch):
    """`run(config, workdir)` says what to install before it writes anything."""
    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(ImportError, match=r'pip install "\.\[experiments\]"'):
        run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def scalar_tags(directory):
    """The tags of the scalars in the TensorBoard event files of `directory`."""
    tags = set()
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            tags.update(value.tag for value in event.summary.value)
    return tags


def optional_extras_tests(figure, run, config):
    """The two tests of an experiment's optional extras, for its module to take up.

    `figure(tiny, path)` draws the figure of the module's `tiny` run to `path`;
    `run(config, workdir)` runs the experiment.
    """

    def test_figure_is_skipped_with_a_warning_without_matplotlib(
        tiny, tmp_path, monkeypatch, caplog
    ):
        assert_figure_skipped_without_matplotlib(
            lambda path: figure(tiny, path),
            str(tmp_path / "figure.png"),
            monkeypatch,
            caplog,
        )

    def test_run_without_scikit_learn_says_what_to_install_before_writing(
        tmp_path, monkeypatch
    ):
        assert_run_needs_scikit_learn(run, config, tmp_path, monkeypatch)

    return (
        test_figure_is_skipped_with_a_warning_without_matplotlib,
        test_run_without_scikit_learn_says_what_to_install_before_writing,
    )
