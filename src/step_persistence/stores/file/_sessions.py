"""How every operation of a `FileStepStore` reaches one run's files: its turn, its lock, its index.

An operation on a run waits for its turn (calls on one run take effect in the order they were
made), runs in a worker thread, and holds the run's lock file (exclusive to write, shared to
read) while it uses the run's `RunIndex`. Indexes of the most recently used runs are kept; any
error inside a session drops the run's index, so the next use rebuilds it from the files.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio.to_thread

from step_persistence._lru import BoundedLru
from step_persistence.stores._turns import RunTurns
from step_persistence.stores.file._index import RunIndex
from step_persistence.stores.file._io import FileIo, UnsafePath
from step_persistence.stores.file._layout import RunPaths, run_paths
from step_persistence.stores.file._locking import RunNotRegistered, locked_run
from step_persistence.stores.file._run_files import stored_run_id

__all__ = ['RunSessions', 'check_run_file']

T = TypeVar('T')


def check_run_file(io: FileIo, paths: RunPaths) -> None:
    """Raise `ValueError` if the run's `run.json` names another run than its directory does.

    A directory copied or renamed by hand, or a run id differing only in case from another on a
    case-insensitive file system, would otherwise give one run's files under another id. An
    unreadable `run.json` is not checked here (`get_run` reports it; the run's other files stay
    usable); a symbolic link raises `UnsafePath`.
    """
    try:
        run_id = stored_run_id(io.read_all(paths.run_file))
    except (OSError, ValueError) as error:
        if isinstance(error, UnsafePath):
            raise
        return
    if isinstance(run_id, str) and run_id != paths.directory.name:
        raise ValueError(foreign_run_message(paths, run_id))


def foreign_run_message(paths: RunPaths, run_id: str) -> str:
    """Why the files under `paths` are not used as the run their directory names."""
    return (
        f'run directory {paths.directory} holds run {run_id!r}, not {paths.directory.name!r} (a directory '
        'copied or renamed by hand, or a run id differing only in case on a case-insensitive file system)'
    )


class RunSessions:
    """Turns, worker threads, locks and cached indexes of the runs under `directory`.

    `threads` bounds the worker threads of the store, apart from anyio's default pool;
    `index_capacity` is how many runs' indexes are kept in memory.
    """

    def __init__(self, directory: Path, io: FileIo, *, threads: int, index_capacity: int) -> None:
        self.directory = directory
        self.io = io
        self._turns = RunTurns()
        self._threads = anyio.CapacityLimiter(threads)
        self._indexes: BoundedLru[str, RunIndex] = BoundedLru(index_capacity)
        self._guard = threading.Lock()
        """Guards `_indexes`, which worker threads share."""

    async def in_thread(self, function: Callable[[], T]) -> T:
        """Run `function` in one of the store's worker threads."""
        return await anyio.to_thread.run_sync(function, limiter=self._threads)

    async def in_turn(self, run_id: str, function: Callable[[], T]) -> T:
        """Run `function` in a worker thread after every earlier call on `run_id` is done."""
        async with self._turns.turn(run_id):
            return await self.in_thread(function)

    async def write(self, run_id: str, write: Callable[[RunIndex], T], *, register: Callable[[], None]) -> T:
        """In the run's turn: `write(index)` under the run's exclusive lock; for a run that is not stored,
        `register()` first (from the worker thread, in the turn), then the write."""
        return await self.in_turn(run_id, partial(self._write, run_id, write, register))

    def _write(self, run_id: str, write: Callable[[RunIndex], T], register: Callable[[], None]) -> T:
        with self.io.grouped_syncs():  # one flush of the files the call wrote, not one per file
            return self._write_grouped(run_id, write, register)

    def _write_grouped(self, run_id: str, write: Callable[[RunIndex], T], register: Callable[[], None]) -> T:
        try:
            with self.session(run_id, exclusive=True) as index:
                return write(index)
        except RunNotRegistered:
            register()
        with self.session(run_id, exclusive=True) as index:
            return write(index)

    def read(self, run_id: str, read: Callable[[RunIndex], T], absent: T) -> T:
        """From a worker thread: `read(index)` under the run's shared lock; `absent` if the run is not registered."""
        try:
            with self.session(run_id, exclusive=False) as index:
                return read(index)
        except RunNotRegistered:
            return absent

    async def read_in_turn(self, run_id: str, read: Callable[[RunIndex], T], absent: T) -> T:
        """`read` in the run's turn."""
        return await self.in_turn(run_id, partial(self.read, run_id, read, absent))

    @contextmanager
    def session(self, run_id: str, *, exclusive: bool) -> Iterator[RunIndex]:
        """From a worker thread: hold the run's lock and yield its index, caught up with nothing yet.

        Raises `RunNotRegistered` (a `LookupError`) if the run does not exist, `ValueError` if its
        directory is a symbolic link or holds another run (`check_run_file`). After any error the
        index is dropped, so the next use rebuilds it from the files.
        """
        paths = run_paths(self.directory, run_id)
        with self._guard:
            index = self._indexes.get_or_build(run_id, partial(RunIndex, paths))
        with index.lock:
            try:
                with locked_run(paths.lock_file, exclusive=exclusive, io=self.io) as incarnation:
                    index.adopt(incarnation)
                    if not index.verified:
                        check_run_file(self.io, paths)
                        index.verified = True
                    yield index
            except BaseException:
                self.forget(run_id)
                raise

    def forget(self, run_id: str) -> None:
        """Drop the index of `run_id` (it is rebuilt from the files on next use)."""
        with self._guard:
            self._indexes.pop(run_id)

    def clear(self) -> None:
        """Drop every cached index."""
        with self._guard:
            self._indexes.clear()
