"""Exact backups: a killed `fit` resumes at the exact step, bit for bit (docs/resume.md)."""

from maskfit.backup.callback import ExactBackupAndRestore

__all__ = ["ExactBackupAndRestore"]
