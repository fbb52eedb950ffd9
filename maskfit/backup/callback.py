"""`ExactBackupAndRestore`: a killed `fit` resumes at the exact step, bit for bit."""

import os
import shutil
import warnings

import keras
import tensorflow as tf

from maskfit import support
from maskfit.backup import files, input_order, state
from maskfit.internals import data as internals
from maskfit.internals import jax_trainer as jax_internals

__all__ = ["ExactBackupAndRestore"]


def _on_jax():
    return keras.backend.backend() == "jax"


class _Resume:
    """What a restored backup still has to do in the resumed `fit`."""

    def __init__(self, backup, steps_per_execution, model_loaded):
        progress = backup.progress
        self.backup = backup
        self.epoch = progress["epoch"]
        self.model_pending = not model_loaded
        self.rng_pending = True
        self.metrics_pending = progress["steps_done"] > 0
        self.first_call = True
        # Calls of the resumed epoch that only read their batches, then the
        # batches that earlier epochs took from the same data iterator.
        self.skip_calls = progress["steps_done"] // steps_per_execution
        self.extra_batches = max(0, progress["position"] - progress["steps_done"])
        self.logs = progress["logs"] or {}


class ExactBackupAndRestore(keras.callbacks.Callback):
    """Backs up training so that a killed `fit` resumes where it was, bit for bit.

    A drop-in for `keras.callbacks.BackupAndRestore`, with the same arguments.
    With an integer `save_freq`, Keras's callback restores the weights saved
    mid-epoch and then runs the interrupted epoch again from its first batch;
    this one continues it with the batch after the last one saved: the batches
    already trained are read again from the input but not trained on, and the
    weights, optimizer variables (slots, EMA, accumulators, loss scale), masks,
    mask schedules and pruning state, seed generators, metric states and the
    global random states are those of the backup. The resumed run then ends
    with the weights and optimizer variables of an uninterrupted one.

    Inputs it resumes exactly: arrays (shuffled ones with a global seed set),
    `tf.data.Dataset`s whose order is the same on every pass, and
    `keras.utils.PyDataset`s; for another input it warns once when `fit`
    starts, and a resumed epoch then skips as many batches as were trained,
    not the same ones (docs/resume.md). Every backup is written into a new
    folder and renamed into place: a kill during a write leaves the previous
    backup whole. Batch callbacks are called for the skipped batches, with the
    logs of the backup.

    Args:
      backup_dir: folder of the backups (a local path: its writes rely on an
        atomic rename); not shared with another callback or run.
      save_freq: `"epoch"` (a backup after each epoch) or a number of steps.
      double_checkpoint: keep the previous backup too, and load it if the
        newest cannot be read.
      delete_checkpoint: remove `backup_dir` when `fit` completes.

    Raises:
      ValueError: an argument is invalid.

    Example:

    >>> import os, tempfile
    >>> import keras, maskfit, numpy as np
    >>> backup = maskfit.ExactBackupAndRestore(
    ...     os.path.join(tempfile.mkdtemp(), "backup"), save_freq=2)
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="adam", loss="mse")
    >>> history = model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=2,
    ...                     epochs=2, callbacks=[backup], verbose=0)
    """

    def __init__(
        self,
        backup_dir,
        save_freq="epoch",
        double_checkpoint=False,
        delete_checkpoint=True,
    ):
        support.require("exact_backup")  # on every backend maskfit runs on
        super().__init__()
        backup_dir = _checked_arguments(
            backup_dir, save_freq, double_checkpoint, delete_checkpoint
        )
        self.backup_dir = backup_dir
        self.save_freq = save_freq
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        self._inner = None  # the train function this callback's wrapper calls
        self._wrapper = None
        self._start(steps_per_execution=1, fit_input=None)

    def _start(self, steps_per_execution, fit_input):
        self._spe = steps_per_execution
        self._fit_input = fit_input
        self._iterator = None  # the data iterator of the latest call
        self._position = 0  # batches taken from it, as Keras counts them
        self._begin = 0  # the first step of the current call in its epoch
        self._epoch = 0
        self._since_save = 0
        self._trained = False  # whether the latest call trained
        self._expected = False  # whether fit announced the next call
        self._epoch_rng = None
        self._resume = None

    @property
    def _unsynced(self):
        """The model, without `self.model`'s sync of the JAX state (each step)."""
        return jax_internals.callback_model(self)

    # --- fit's hooks

    def on_train_begin(self, logs=None):
        model = self.model
        spe = int(model.steps_per_execution)
        self._start(spe, internals.fit_input(model))
        reasons = input_order.hazards(self._fit_input)
        if reasons:
            warnings.warn(
                "ExactBackupAndRestore cannot resume this input at the exact"
                f" batch: {'; '.join(reasons)}. A run resumed inside an epoch"
                " skips as many batches as were trained, not the same ones.",
                stacklevel=2,
            )
        tries = 2 if self.double_checkpoint else 1
        backup = state.read_newest(self.backup_dir, tries=tries)
        if backup is not None:
            _check_resumable(backup, spe, (self.params or {}).get("steps"))
            if model.built:
                state.restore_model(model, backup)
            self._resume = _Resume(backup, spe, model_loaded=model.built)
            internals.set_initial_epoch(model, self._resume.epoch)
            internals.restore_epoch_count(
                self._fit_input, epoch_length=backup.progress["epoch_length"]
            )
        self._install()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        resume = self._resume
        if resume is not None and resume.rng_pending:
            resume.rng_pending = False
            internals.set_initial_epoch(self._unsynced, None)
            state.restore_rng(resume.backup)
        if resume is not None and resume.metrics_pending and _on_jax():
            # JAX's fit reads them into the state it passes to the first call:
            # restored after it reset them, before that. (TensorFlow's first
            # call restores them, after Keras built its compiled metrics.)
            resume.metrics_pending = not state.restore_metrics(
                self._unsynced, resume.backup
            )
        self._epoch_rng = state.rng_state()

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch
        self._expected = True
        if self._unsynced.train_function is not self._wrapper:
            self._install()

    def on_train_batch_end(self, batch, logs=None):
        if not self._trained or self.save_freq == "epoch":
            return
        self._since_save += self._spe
        if self._since_save >= self.save_freq:
            self._since_save = 0
            steps_done = self._begin + self._spe
            self._save(self._epoch, steps_done, self._position, logs, self._epoch_rng)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq != "epoch":
            return
        kept = internals.iterator_kept(self._fit_input, self._iterator)
        self._save(epoch + 1, 0, self._position if kept else 0, None, state.rng_state())

    def on_train_end(self, logs=None):
        if self._unsynced.train_function is self._wrapper:
            _set_train_function(self._unsynced, self._inner)
        if self._resume is not None and self._resume.rng_pending:
            internals.set_initial_epoch(self._unsynced, None)
        self._start(self._spe, None)
        if self.delete_checkpoint and os.path.isdir(self.backup_dir):
            shutil.rmtree(self.backup_dir)

    # --- the train function's wrapper

    def _install(self):
        """Wraps `model.train_function` (again, after Keras or maskfit made a new one)."""
        current = self._unsynced.train_function
        if current is not None and current is self._wrapper:
            return
        # A wrapper left by a fit that an exception ended: wrap what it wrapped.
        while getattr(current, "_exact_backup", None) is not None:
            current = current._exact_backup._inner
        self._inner = current

        def train_function(*args):
            return self._call(*args)

        train_function._exact_backup = self
        self._wrapper = train_function
        _set_train_function(self._unsynced, train_function)

    def _call(self, *args):
        """One call of the train function: `(iterator)`, or `(state, iterator)` on JAX.

        Under JAX the state (weights, optimizer, metrics, seeds) is passed in
        and returned; a skipped call returns it as it came.
        """
        iterator = args[-1]
        if not self._expected:
            # Not a call of this callback's fit (train_on_batch, or a fit that
            # an exception ended): straight through.
            return self._call_inner(*args)
        self._expected = False
        resume = self._resume
        if resume is not None and resume.first_call:
            resume.first_call = False
            self._finish_restore(resume, iterator)
        if iterator is not self._iterator:
            self._iterator, self._position = iterator, 0
        if resume is not None and resume.extra_batches:
            _take(iterator, resume.extra_batches, partial=False)
            self._position += resume.extra_batches
            internals.restore_epoch_count(self._fit_input, batches=resume.extra_batches)
            resume.extra_batches = 0
        if resume is not None and resume.skip_calls:
            resume.skip_calls -= 1
            self._trained = False
            _take(iterator, self._spe, partial=True)
            self._position += self._spe
            return resume.logs if len(args) == 1 else (resume.logs, args[0])
        self._trained = True
        returned = self._call_inner(*args)
        self._position += self._spe
        return returned

    def _call_inner(self, *args):
        inner = self._inner
        # While it runs, the model shows its own function: maskfit's may make
        # a new one and call it in its place.
        model = self._unsynced
        _set_train_function(model, inner)
        try:
            return inner(*args)
        finally:
            if model.train_function is not inner:
                self._inner = model.train_function
            _set_train_function(model, self._wrapper)

    def _finish_restore(self, resume, iterator):
        """Restores what `on_train_begin` could not: an unbuilt model, metrics."""
        model = self._unsynced
        if resume.model_pending:
            internals.symbolic_build(model, iterator.element_spec)
            state.restore_model(model, resume.backup)
            resume.model_pending = False
            _set_train_function(model, self._inner)
            model.make_train_function()
            self._inner = model.train_function
            _set_train_function(model, self._wrapper)
        if resume.metrics_pending:
            if not state.restore_metrics(model, resume.backup):
                # Compiled metrics that Keras builds in the first step.
                try:
                    internals.symbolic_build(model, iterator.element_spec)
                except Exception:  # noqa: BLE001 - the logs only start from 0
                    pass
                if not state.restore_metrics(model, resume.backup):
                    warnings.warn(
                        "ExactBackupAndRestore could not restore the metrics of"
                        " the interrupted epoch: its logs start from 0 (the"
                        " weights are restored).",
                        stacklevel=3,
                    )

    # --- backups

    def _save(self, epoch, steps_done, position, logs, rng):
        model = self.model  # under JAX, reading it syncs the state into it
        progress = {
            "epoch": epoch,
            "steps_done": steps_done,
            "position": position,
            "steps_per_execution": self._spe,
            "epoch_length": internals.learned_epoch_length(self._fit_input),
            "optimizer_step": _optimizer_step(model),
            "logs": _plain(logs),
        }
        files.write(
            self.backup_dir,
            lambda folder: state.write(folder, model, progress, rng),
            keep=2 if self.double_checkpoint else 1,
        )


def _set_train_function(model, function):
    # Past Keras's attribute tracking (16 us a call), which a function skips
    # anyway: the wrapper sets it twice a step.
    object.__setattr__(model, "train_function", function)


def _checked_arguments(backup_dir, save_freq, double_checkpoint, delete_checkpoint):
    """Returns `backup_dir` as a string; raises ValueError for a bad argument."""
    if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
        raise ValueError(
            "ExactBackupAndRestore needs `backup_dir`, a local folder path."
            f" Received: backup_dir={backup_dir!r}"
        )
    backup_dir = os.fspath(backup_dir)
    if "://" in backup_dir:
        raise ValueError(
            "ExactBackupAndRestore writes backups atomically by renaming a"
            " folder, which needs a local file system; back up to a local"
            f" folder and copy it out. Received: backup_dir={backup_dir!r}"
        )
    if save_freq != "epoch" and (
        isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1
    ):
        raise ValueError(
            'Invalid `save_freq`: expected "epoch" or a positive number of'
            f" steps. Received: save_freq={save_freq!r}"
        )
    for name, value in (
        ("double_checkpoint", double_checkpoint),
        ("delete_checkpoint", delete_checkpoint),
    ):
        if not isinstance(value, bool):
            raise ValueError(
                f"`{name}` must be True or False. Received: {name}={value!r}"
            )
    return backup_dir


def _check_resumable(backup, steps_per_execution, steps):
    """Raises ValueError if this `fit` cannot go on from `backup` at its step."""
    progress = backup.progress
    done, epoch = progress["steps_done"], progress["epoch"]
    if done % steps_per_execution:
        raise ValueError(
            f"The backup in {backup.path} was saved after step {done} of epoch"
            f" {epoch} with steps_per_execution={progress['steps_per_execution']};"
            f" this fit runs steps_per_execution={steps_per_execution}, which does"
            " not divide it. Compile with the backup's steps_per_execution to resume."
        )
    if steps and done > steps:
        raise ValueError(
            f"The backup in {backup.path} was saved after step {done} of epoch"
            f" {epoch}, but this fit's epochs have {steps} steps. Resume with"
            " the input and steps_per_epoch the backup was made with."
        )


def _take(iterator, count, partial):
    """Reads `count` batches from `iterator` without training on them.

    Raises StopIteration, as Keras's train function does, when the input ends
    before the first (`partial`) or before the last of them.
    """
    for taken in range(count):
        try:
            next(iterator)
        except (StopIteration, tf.errors.OutOfRangeError):
            if partial and taken:
                return
            raise StopIteration from None


def _optimizer_step(model):
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not optimizer.built:
        return 0
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def _plain(logs):
    """`logs` as JSON-ready numbers (lists for array values)."""
    plain = {}
    for name, value in (logs or {}).items():
        value = keras.ops.convert_to_numpy(value)
        plain[name] = value.item() if value.ndim == 0 else value.tolist()
    return plain
