"""What an exact backup holds, how it is written into a folder, and how it is put back.

A backup folder holds:
- `model.weights.h5` (`model.save_weights`): the weights and every optimizer
  variable (iterations, slots, EMA averages, accumulated gradients, loss scale);
  a `MaskedModel` adds its rules' keep masks and which variables its optimizer
  has slots for. Masks and mask schedules need nothing more: the step reads
  them from `optimizer.iterations`.
- `state.npz`: what the weights file leaves out: the `SeedGenerator` states of
  layers (dropout), the metric variables (so the interrupted epoch's logs
  continue), and the NumPy and Python global random states at the start of the
  epoch (a `PyDataset` shuffled by `fit`, or one that draws its order in
  `on_epoch_begin`, reads them).
- `progress.json`, written last: the epoch, the steps done in it, the batches
  taken from the data iterator, and the logs of the last step.
"""

import contextlib
import json
import os
import random

import h5py
import keras
import numpy as np

from maskfit.backup import files

__all__ = [
    "Backup",
    "read",
    "read_newest",
    "restore_metrics",
    "restore_model",
    "restore_rng",
    "rng_state",
    "write",
]

# The files `keras.callbacks.BackupAndRestore` writes, to refuse its backups.
_KERAS_FILES = ("latest.weights.h5", "training_metadata.json")
WEIGHTS = "model.weights.h5"
ARRAYS = "state.npz"
PROGRESS = "progress.json"
FORMAT = 1


class Backup:
    """A backup read back and checked: `path`, `progress` (dict) and `arrays`."""

    def __init__(self, path, progress, arrays):
        self.path = path
        self.progress = progress
        self.arrays = arrays

    @property
    def weights_path(self):
        return os.path.join(self.path, WEIGHTS)


def rng_state():
    """The Python and NumPy global random states, as they are now."""
    return random.getstate(), np.random.get_state()


def write(folder, model, progress, rng):
    """Writes `model`'s training state, `progress` (a dict) and `rng` into `folder`."""
    model.save_weights(os.path.join(folder, WEIGHTS))
    python_rng, numpy_rng = rng
    arrays = {
        "python_rng": np.asarray(python_rng[1], np.uint64),
        "numpy_rng": np.asarray(numpy_rng[1]),
    }
    seeds = _seed_states(model)
    for i, variable in enumerate(seeds):
        arrays[f"seed_{i}"] = keras.ops.convert_to_numpy(variable)
    metrics = list(model.metrics_variables)
    for i, variable in enumerate(metrics):
        arrays[f"metric_{i}"] = keras.ops.convert_to_numpy(variable)
    with open(os.path.join(folder, ARRAYS), "wb") as f:
        np.savez(f, **arrays)
    progress = dict(
        progress,
        format=FORMAT,
        seeds=len(seeds),
        metrics=len(metrics),
        python_rng={"version": python_rng[0], "gauss_next": python_rng[2]},
        numpy_rng={
            "kind": numpy_rng[0],
            "pos": int(numpy_rng[2]),
            "has_gauss": int(numpy_rng[3]),
            "cached_gaussian": float(numpy_rng[4]),
        },
    )
    _write_progress(os.path.join(folder, PROGRESS), progress)


def _write_progress(path, progress):
    with open(path, "w") as f:
        json.dump(progress, f)


def read_newest(directory, tries=1):
    """Reads the newest complete backup in `directory` that reads (of the `tries`
    newest); None if there is none.

    Raises:
      OSError: none of them can be read.
      ValueError: `directory` holds a backup of `keras.callbacks.BackupAndRestore`.
    """
    found = files.complete(directory)
    if not found:
        stock = [n for n in _KERAS_FILES if os.path.exists(os.path.join(directory, n))]
        if stock:
            raise ValueError(
                f"backup_dir {directory!r} holds a backup of"
                f" keras.callbacks.BackupAndRestore ({', '.join(stock)}), which"
                " ExactBackupAndRestore cannot resume exactly: resume it with"
                " Keras's callback, or remove it to start over."
            )
        return None
    files.remove_partials(directory)
    errors = []
    for path in found[:tries]:
        try:
            return read(path)
        except (OSError, ValueError, KeyError) as error:
            errors.append(f"{path}: {error}")
    raise OSError(
        "ExactBackupAndRestore cannot read its backup"
        f"{'s' if len(errors) > 1 else ''}: {'; '.join(errors)}"
    )


def read(folder):
    """Reads and checks the backup in `folder`.

    Raises:
      OSError or ValueError: a file is missing, truncated or of another format.
    """
    with open(os.path.join(folder, PROGRESS)) as f:
        progress = json.load(f)
    if progress.get("format") != FORMAT:
        raise ValueError(
            f"Backup {folder} has format {progress.get('format')!r}; this maskfit"
            f" reads format {FORMAT}."
        )
    with np.load(os.path.join(folder, ARRAYS)) as stored:
        arrays = {name: stored[name] for name in stored.files}
    # Read every array of the weights file, so that a damaged one fails here,
    # before anything is loaded into the model.
    with h5py.File(os.path.join(folder, WEIGHTS), "r") as weights:
        weights.visititems(
            lambda _, item: item[()] if isinstance(item, h5py.Dataset) else None
        )
    return Backup(folder, progress, arrays)


def restore_model(model, backup):
    """Loads the weights, optimizer variables and seed states of `backup` into `model`."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        # Under a tf.distribute strategy, in its scope (JAX has none).
        strategy = getattr(model, "distribute_strategy", None)
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            optimizer.build(model.trainable_variables)
    seeds = _seed_states(model)
    if len(seeds) != backup.progress["seeds"]:
        raise ValueError(
            f"Backup {backup.path} holds {backup.progress['seeds']} random seed"
            f" states, but model '{model.name}' has {len(seeds)}. Resume with the"
            " model the backup was made from."
        )
    weights = list(model.weights)
    before = [keras.ops.convert_to_numpy(w) for w in weights]
    try:
        model.load_weights(backup.weights_path)
    except Exception:
        # Keras loads layer by layer: put back what it loaded before failing.
        for weight, value in zip(weights, before):
            weight.assign(value)
        raise
    for i, variable in enumerate(seeds):
        variable.assign(backup.arrays[f"seed_{i}"])


def restore_metrics(model, backup):
    """Puts the metric variables of `backup` back; False if `model`'s do not match."""
    variables = list(model.metrics_variables)
    if len(variables) != backup.progress["metrics"]:
        return False
    values = [backup.arrays[f"metric_{i}"] for i in range(len(variables))]
    if any(tuple(v.shape) != np.shape(x) for v, x in zip(variables, values)):
        return False
    for variable, value in zip(variables, values):
        variable.assign(value)
    return True


def restore_rng(backup):
    """Sets the Python and NumPy global random states saved in `backup`."""
    python_rng = backup.progress["python_rng"]
    random.setstate(
        (
            python_rng["version"],
            tuple(int(x) for x in backup.arrays["python_rng"]),
            python_rng["gauss_next"],
        )
    )
    numpy_rng = backup.progress["numpy_rng"]
    np.random.set_state(
        (
            numpy_rng["kind"],
            backup.arrays["numpy_rng"],
            numpy_rng["pos"],
            numpy_rng["has_gauss"],
            numpy_rng["cached_gaussian"],
        )
    )


def _seed_states(model):
    """The model's state that its weights leave out: its layers' `SeedGenerator` states."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]
