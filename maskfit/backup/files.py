"""Backup folders written atomically: a kill at any point leaves the last complete one.

A backup is written into a fresh `.partial-*` folder, its files and the folder
are flushed to disk (fsync), and only then is it renamed to `backup-<serial>`:
a rename within one file system is atomic, so a folder with that name is always
complete. The previous backups are removed after the rename; a kill between
the two leaves one more complete backup, which the next write removes.
"""

import os
import re
import shutil

__all__ = ["complete", "remove_partials", "write"]

_PREFIX = "backup-"
_PARTIAL = ".partial-"
_COMPLETE = re.compile(r"^backup-(\d{8})$")
_ANY = re.compile(r"^(?:backup-|\.partial-)(\d{8})")


def complete(directory):
    """Returns the complete backups in `directory`, newest first ([] if none)."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = _COMPLETE.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return [path for _, path in sorted(found, reverse=True)]


def remove_partials(directory):
    """Removes what killed writes left in `directory` (never a complete backup)."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name.startswith(_PARTIAL):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def write(directory, fill, keep=1):
    """Writes a new backup with `fill(folder)` and makes it the newest; returns its path.

    Args:
      directory: the backup directory (made if missing).
      fill: writes the backup's files into the folder it is given.
      keep: how many complete backups to keep, the new one included.
    """
    os.makedirs(directory, exist_ok=True)
    remove_partials(directory)
    serials = [int(m.group(1)) for m in map(_ANY.match, os.listdir(directory)) if m]
    serial = max(serials, default=0) + 1
    partial = os.path.join(directory, f"{_PARTIAL}{serial:08d}")
    os.mkdir(partial)
    fill(partial)
    _sync_tree(partial)
    final = os.path.join(directory, f"{_PREFIX}{serial:08d}")
    os.rename(partial, final)
    _sync(directory)
    for old in complete(directory)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _sync_tree(folder):
    for root, _, names in os.walk(folder):
        for name in names:
            _sync(os.path.join(root, name))
        _sync(root)


def _sync(path):
    """Flushes a file or a folder to disk (folders cannot be opened on Windows)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        if os.path.isdir(path):
            return
        raise
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
