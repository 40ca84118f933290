"""The per-run lock that serializes writers across threads and processes.

Each run has a `run.lock` file created with the run. Writers hold an exclusive `flock` on it for
the whole of a write (catching up with the run's files, deciding, appending); readers hold a shared
one, so they never see a write in progress. `flock` locks belong to an open file description, so
two threads of one process exclude each other as two processes do. The file holds the run's
incarnation token: a run deleted and registered again gets a new token, which tells every process
that what it cached about the old run is void.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from step_persistence.stores.file._io import FileIo, open_unlinked, real_directory

__all__ = ['RunNotRegistered', 'locked_run', 'new_incarnation']

_TOKEN_BYTES = 16


class RunNotRegistered(LookupError):
    """The run has no directory (never registered, or deleted)."""


def new_incarnation() -> str:
    """A fresh incarnation token for a run being registered."""
    return secrets.token_hex(_TOKEN_BYTES)


@contextmanager
def locked_run(lock_file: Path, *, exclusive: bool, io: FileIo) -> Iterator[str]:
    """Hold the run's lock (exclusive or shared) and yield its incarnation token.

    Raises `RunNotRegistered` if the run does not exist, also when it was deleted while waiting, and
    `UnsafePath` if the run's directory or its lock file is a symbolic link.
    """
    import fcntl  # POSIX only: imported here so that importing the package works everywhere.

    while True:
        try:
            real_directory(lock_file.parent)
            fd = open_unlinked(lock_file, os.O_RDONLY)
        except FileNotFoundError:
            raise RunNotRegistered(f'run {lock_file.parent.name!r} is not registered') from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            if _is_current(fd, lock_file):
                # A damaged token only reads as another incarnation: the run's index is rebuilt from its files.
                yield io.read_fd(fd, 2 * _TOKEN_BYTES).decode('ascii', errors='replace')
                return
        finally:
            os.close(fd)


def _is_current(fd: int, lock_file: Path) -> bool:
    """Whether the locked file is still the run's lock file (the run was not deleted meanwhile)."""
    try:
        current = os.stat(lock_file)
    except FileNotFoundError:
        return False
    locked = os.fstat(fd)
    return (locked.st_dev, locked.st_ino) == (current.st_dev, current.st_ino)
