"""The locks that serialize writers across threads and processes: per run, per line, per conversation.

Each run has a `run.lock` file created with the run, each history line a `line.lock`. Writers hold
an exclusive `flock` on it for the whole of a write (catching up with the files, deciding,
appending); readers hold a shared one, so they never see a write in progress. `flock` locks belong
to an open file description, so two threads of one process exclude each other as two processes
do. A lock file holds a token: a run deleted and registered again (or a line whose messages were
compacted) gets a new one, which tells every process that what it cached is void.

**Order.** A thread takes at most one run lock, then at most one line lock, except that a save
creating a branch also holds the new line, which no other thread can be waiting for yet. A line
lock is never held while waiting for a run lock (reads of another run's journal under a line lock
take no lock), and conversation and origin locks are taken holding nothing but a run lock. So
locks are always taken in the order run, line, and no two threads can wait for each other.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from step_persistence.stores.file._io import FileIo, open_unlinked, real_directory

__all__ = [
    'TOKEN_LENGTH',
    'LineMissing',
    'RunNotRegistered',
    'hold_exclusively',
    'locked_file',
    'locked_run',
    'locked_token',
    'new_incarnation',
    'replace_token',
]

_TOKEN_BYTES = 16
TOKEN_LENGTH = 2 * _TOKEN_BYTES
"""Characters of a token (hex)."""


class RunNotRegistered(LookupError):
    """The run has no directory (never registered, or deleted)."""


class LineMissing(LookupError):
    """The history line has no directory (removed with the last view that used it, or never made)."""


def new_incarnation() -> str:
    """A fresh token for a run being registered or a line being made or compacted."""
    return secrets.token_hex(_TOKEN_BYTES)


def _flock(fd: int, *, exclusive: bool) -> None:
    import fcntl  # POSIX only: imported here so that importing the package works everywhere.

    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


@contextmanager
def locked_file(
    lock_file: Path, *, exclusive: bool, flags: int = os.O_RDONLY, missing: Callable[[], Exception]
) -> Iterator[int]:
    """Hold `lock_file`'s lock (exclusive or shared) and yield its open descriptor.

    The file may be removed or replaced while this waits: the lock is taken again on the file the
    path names once it is held, so what is held is always the current file. Raises `missing()` if
    there is none (with `os.O_CREAT` in `flags`, one is created), and `UnsafePath` if the file or
    its directory is a symbolic link.
    """
    while True:
        try:
            real_directory(lock_file.parent)
            fd = open_unlinked(lock_file, flags)
        except FileNotFoundError:
            raise missing() from None
        try:
            _flock(fd, exclusive=exclusive)
            if _is_current(fd, lock_file):
                yield fd
                return
        finally:
            os.close(fd)


@contextmanager
def locked_token(lock_file: Path, *, exclusive: bool, io: FileIo, missing: Callable[[], LookupError]) -> Iterator[str]:
    """Hold a run's or a line's lock (`locked_file`) and yield its token."""
    with locked_file(lock_file, exclusive=exclusive, missing=missing) as fd:
        # A damaged token only reads as another incarnation: what was cached is rebuilt from the files.
        yield io.read_fd(fd, TOKEN_LENGTH).decode('ascii', errors='replace')


@contextmanager
def locked_run(lock_file: Path, *, exclusive: bool, io: FileIo) -> Iterator[str]:
    """Hold the run's lock and yield its incarnation token.

    Raises `RunNotRegistered` if the run does not exist, also when it was deleted while waiting, and
    `UnsafePath` if the run's directory or its lock file is a symbolic link.
    """
    name = lock_file.parent.name
    with locked_token(
        lock_file, exclusive=exclusive, io=io, missing=lambda: RunNotRegistered(f'run {name!r} is not registered')
    ) as token:
        yield token


@contextmanager
def hold_exclusively(lock_file: Path) -> Iterator[None]:
    """Hold the exclusive lock of a lock file no other thread knows of yet (one being staged).

    It never waits; the lock stays held when the file's directory is renamed into place.
    """
    fd = open_unlinked(lock_file, os.O_RDONLY)
    try:
        _flock(fd, exclusive=True)
        yield
    finally:
        os.close(fd)


def replace_token(lock_file: Path, *, io: FileIo) -> None:
    """Give a run or line a new token (same length, written in place), so every process's cache of it restarts."""
    fd = open_unlinked(lock_file, os.O_WRONLY)
    try:
        os.pwrite(fd, new_incarnation().encode('ascii'), 0)
        io.sync_now(fd)
    finally:
        os.close(fd)


def _is_current(fd: int, lock_file: Path) -> bool:
    """Whether the locked file is still the one `lock_file` names (not removed or replaced meanwhile)."""
    try:
        current = os.stat(lock_file, follow_symlinks=False)
    except FileNotFoundError:
        return False
    locked = os.fstat(fd)
    return (locked.st_dev, locked.st_ino) == (current.st_dev, current.st_ino)
