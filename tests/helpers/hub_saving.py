"""Shrunk zoo backbones saved to a folder, then loaded with Keras and keras_hub alone.

`save(folder, name, small, inputs, expected)` writes `name.keras` (or, where
keras_hub cannot write the model's config, `name.unsaved` with the error),
its inputs and the outputs it must give. `load_all(folder, names)` loads
them all in one fresh Python process that imports only keras, keras_hub and
NumPy (maskfit is not importable there: its path is taken off `sys.path`
and the import is refused), with `safe_mode=True`, and returns
`({name: error}, {name: outputs})`.
"""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np

# Loads the files named in argv[1]'s index with keras and keras_hub only and
# writes each model's flattened outputs beside its file.
_LOADER = textwrap.dedent(
    """
    import importlib.abc, json, os, sys

    class NoMaskfit(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "maskfit" or name.startswith("maskfit."):
                raise ImportError("maskfit must not be imported here: " + name)

    sys.meta_path.insert(0, NoMaskfit())
    import keras, keras_hub, numpy as np

    folder = sys.argv[1]
    errors = {}
    for name in json.load(open(os.path.join(folder, "index.json"))):
        try:
            model = keras.saving.load_model(
                os.path.join(folder, name + ".keras"), safe_mode=True
            )
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"
            continue
        inputs = dict(np.load(os.path.join(folder, name + ".in.npz")))
        if list(inputs) == ["x"]:
            inputs = inputs["x"]
        flat = [
            np.asarray(keras.ops.convert_to_numpy(y), np.float64).reshape(-1)
            for y in keras.tree.flatten(model(inputs))
        ]
        np.save(os.path.join(folder, name + ".out.npy"), np.concatenate(flat))
    json.dump(errors, open(os.path.join(folder, "errors.json"), "w"))
    print("maskfit imported:", any(m.split(".")[0] == "maskfit" for m in sys.modules))
    """
)


def save(folder, name, small, inputs, expected):
    """Writes `small` (its inputs and `expected` outputs) for `load_all`.

    A model keras_hub cannot save (an `AttributeError` from a layer's
    `get_config`) is written as `name.unsaved`, holding the error.
    """
    path = folder / f"{name}.keras"
    try:
        small.save(path)
    except AttributeError as error:
        (folder / f"{name}.unsaved").write_text(str(error))
        return
    with zipfile.ZipFile(path) as archive:  # nothing in the file names maskfit
        assert "maskfit" not in archive.read("config.json").decode().lower(), name
    arrays = inputs if isinstance(inputs, dict) else {"x": inputs}
    np.savez(folder / f"{name}.in.npz", **arrays)
    np.save(folder / f"{name}.expected.npy", expected)


def saved(folder, name):
    """Whether `save` wrote `name` into `folder` (a model or its error)."""
    return (folder / f"{name}.unsaved").exists() or (
        folder / f"{name}.expected.npy"
    ).exists()


def load_all(folder, names):
    """`({name: error}, {name: (loaded outputs, expected)})` for `names` in `folder`."""
    errors = {
        n: (folder / f"{n}.unsaved").read_text()
        for n in names
        if (folder / f"{n}.unsaved").exists()
    }
    (folder / "index.json").write_text(
        json.dumps([n for n in names if n not in errors])
    )
    env = {**os.environ, "PYTHONPATH": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", _LOADER, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "maskfit imported: False" in done.stdout
    errors |= json.loads((folder / "errors.json").read_text())
    outputs = {
        n: (
            np.load(folder / f"{n}.out.npy"),
            np.load(folder / f"{n}.expected.npy"),
        )
        for n in names
        if n not in errors
    }
    return errors, outputs


__all__ = ["load_all", "save", "saved"]
