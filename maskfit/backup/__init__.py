"""Exact backups: a killed `fit` resumes at the exact step, bit for bit (docs/resume.md).

- `callback`: `ExactBackupAndRestore`, a drop-in for
  `keras.callbacks.BackupAndRestore` that skips the batches already trained.
- `state`: what a backup holds beside the weights (optimizer, metrics, RNG
  states, the epoch's position).
- `files`: atomic backup folders (written aside, fsynced, renamed).
- `input_order`: whether `fit`'s input has an order a new process reproduces.

It imports `internals` and `support` only.
"""

from maskfit.backup.callback import ExactBackupAndRestore

__all__ = ["ExactBackupAndRestore"]
