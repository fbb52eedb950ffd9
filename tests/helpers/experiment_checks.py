"""Checks every experiment's tests make: its command line and its optional extras."""

import logging
import os
import sys

import pytest


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
