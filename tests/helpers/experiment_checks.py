"""Checks every experiment's tests make: its command line and its optional extras."""

import dataclasses
import glob
import json
import logging
import os
import sys

import pytest
import tensorflow as tf

from tests.helpers import cli

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


def assert_cli_refuses_bad_flags(experiment, bad_flags, tmp_path, more_argvs=()):
    """Runs `experiments.<experiment>`'s command line once per flag of `bad_flags`
    (`{flag: message}` or `[(flag, message)]`), each with a workdir of its own
    (0, 1, ...), then once per argv of `more_argvs`, all in one process; each bad
    flag must exit non-zero with its message in the output and write nothing.
    Returns all the outcomes (`cli.outcomes`), bad flags' first."""
    bad_flags = dict(bad_flags)
    argvs = bad_flag_argvs(experiment, bad_flags, tmp_path) + list(more_argvs)
    outcomes = cli.outcomes(f"experiments.{experiment}.__main__", argvs)
    for i, ((flag, message), outcome) in enumerate(zip(bad_flags.items(), outcomes)):
        assert outcome["code"] != 0, flag
        assert message in outcome["output"], (flag, outcome["output"][-2000:])
        assert not (tmp_path / str(i)).exists(), flag
    return outcomes


def assert_main_refuses_bad_flags(
    experiment, bad_flags, good_flags, usage, tmp_path, timeout=300
):
    """Runs experiment_main.py: `experiments.<experiment>`'s main once per flag of
    `bad_flags` (`{flag: message}`), each with a workdir of its own (0, 1, ...),
    then with `good_flags`, then with `usage`'s flag through `app.run`. Each bad
    flag must be refused with its message before writing, the good run must
    succeed, and `usage = (flag, message)` must exit with 1 and its message,
    writing nothing. Returns the good run's workdir."""
    argvs = bad_flag_argvs(experiment, bad_flags, tmp_path)
    good = tmp_path / "good"
    argvs.append([experiment, *good_flags, f"--workdir={good}"])
    usage_flag, usage_message = usage
    argvs.append([experiment, usage_flag, f"--workdir={tmp_path / 'cli'}"])
    result = cli.run(
        "experiment_main.py", experiment, json.dumps(argvs), timeout=timeout
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert usage_message in result.stderr
    assert not (tmp_path / "cli").exists()
    outcomes = json.loads(result.stdout.splitlines()[-1])
    assert len(outcomes) == len(bad_flags) + 1
    for index, (outcome, message) in enumerate(zip(outcomes, bad_flags.values())):
        assert message in outcome
        assert not (tmp_path / str(index)).exists()
    assert outcomes[-1] == "ok"
    return good


def config_rejects_test(config, cases, received):
    """A test, parametrized by `cases` (`(field, value, message)`), that
    `config(**{field: value})` raises a ValueError matching
    `f"{message}.*{received}"`, `received` formatted with `field=field`."""

    @pytest.mark.parametrize("field, value, message", cases)
    def test_config_rejects_invalid_values(field, value, message):
        pattern = f"{message}.*{received.format(field=field)}"
        with pytest.raises(ValueError, match=pattern):
            config(**{field: value})

    return test_config_rejects_invalid_values


def bad_config_test(make, cases):
    """A test, parametrized by `cases` (`(changes, message)`), that
    `make(changes)` raises a ValueError whose text contains `message`."""

    @pytest.mark.parametrize("changes, message", cases)
    def test_a_bad_config_is_one_clear_error(changes, message):
        with pytest.raises(ValueError) as error:
            make(changes)
        assert message in str(error.value)

    return test_a_bad_config_is_one_clear_error


def written_config_metrics_and_table(workdir, config, metrics):
    """Asserts `workdir` holds `config` as config.json and `metrics` as
    metrics.json; returns table.md's text and `metrics["summary"]` as JSON
    reads it back."""
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f) == json.loads(json.dumps(dataclasses.asdict(config)))
    with open(os.path.join(workdir, "metrics.json")) as f:
        assert json.load(f) == json.loads(json.dumps(metrics))
    with open(os.path.join(workdir, "table.md")) as f:
        text = f.read()
    return text, json.loads(json.dumps(metrics["summary"]))


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
