"""maskfit.support: the backend table, README's copy of it, the import refusal.

Runs under every backend (its `backends` marker).
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from maskfit import support

pytestmark = pytest.mark.backends("tensorflow", "jax", "torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _table(path, heading):
    """`{feature: (one cell per backend)}` from the table under `heading`."""
    text = (ROOT / path).read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("feature", "") or set(cells[0]) <= {"-"}:
            continue
        rows[cells[0]] = tuple(cells[1:])
    return rows


@pytest.mark.parametrize(
    "path, heading",
    [("README.md", "Backends"), ("docs/backends.md", "What runs where")],
)
def test_the_tables_of_readme_and_docs_are_the_support_table(path, heading):
    rows = _table(path, heading)
    expected = {
        row.name: tuple(
            "yes" if backend in row.backends else "no" for backend in support.BACKENDS
        )
        for row in support.FEATURES.values()
    }
    assert rows == expected


def test_every_refused_feature_says_what_to_do_instead():
    for key, row in support.FEATURES.items():
        if set(row.backends) != set(support.BACKENDS):
            assert row.instead, (
                f"{key} runs on {row.backends} only but says no alternative"
            )


def test_refusal_names_backend_feature_and_alternative(monkeypatch):
    monkeypatch.setattr(support, "backend", lambda: "jax")
    with pytest.raises(NotImplementedError) as caught:
        support.require("strategies")
    message = str(caught.value)
    assert "make_strategy" in message
    assert "'jax' (KERAS_BACKEND=jax)" in message
    assert "it runs on tensorflow" in message
    assert "keras.distribution.DataParallel" in message
    support.require("model")  # runs on both: no error


def test_another_backend_import_error_says_what_runs_where():
    with pytest.raises(ImportError) as caught:
        support.check_backend("numpy")
    message = str(caught.value)
    assert "'numpy' (KERAS_BACKEND=numpy)" in message
    for backend in support.BACKENDS:
        assert f"KERAS_BACKEND={backend}" in message
        support.check_backend(backend)


def test_torch_refusal_names_the_row_and_what_to_use_instead(monkeypatch):
    monkeypatch.setattr(support, "backend", lambda: "torch")
    with pytest.raises(NotImplementedError) as caught:
        support.require("sparse_training", "sparsify")
    message = str(caught.value)
    assert "dynamic sparse training (`maskfit.sparse`" in message
    assert "(sparsify)" in message
    assert "'torch' (KERAS_BACKEND=torch)" in message
    assert "it runs on tensorflow, jax" in message
    assert "Instead: a static sparse `ElementMask` trains on every backend" in message
    support.require("saving")  # runs on all three: no error
    support.require("magnitude_pruning", "prune_low_magnitude")  # and these
    support.require("structured_oneshot", "select_units")


@pytest.mark.parametrize("backend", ["numpy"])
def test_import_under_an_unsupported_backend_fails_at_once(backend):
    # Keras's numpy backend needs nothing more than NumPy.
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", "import maskfit"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(r"ImportError: maskfit runs on the Keras backends", last), last
    assert f"KERAS_BACKEND={backend}" in last
