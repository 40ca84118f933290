"""History lines on disk: making them, locking them, indexing them, reading views through them.

A line lives in `@lines/<line_id>/` (see `_layout`). It is made whole in `@tmp/` (its base in
`line.json`, before any row) and renamed into place with its lock already held by its maker, so
no other thread sees it before its first snapshot is committed. Rows are appended under the line's
exclusive lock; a save keeps that lock until its snapshot is committed, so under the lock every
row of the line belongs to a committed snapshot or to a save that crashed. Readers catch up with
a line under its shared lock and read the rows they chose before releasing it, so compaction
(exclusive, replacing the file and the lock's token) never changes a file under them.

Each process keeps an index of the lines it used recently (`LineIndex`: the line's base and its
rows by position), caught up incrementally like a run's journals.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from step_persistence._lru import BoundedLru
from step_persistence.stores._positions import LineBase, LineId, ViewSegment, assemble, view_segments
from step_persistence.stores.file._codec import LineView, dump_line_file, load_line_file
from step_persistence.stores.file._io import FileIo, real_directory
from step_persistence.stores.file._layout import LINES_DIRECTORY_NAME, WORK_DIRECTORY_NAME, LinePaths, line_paths
from step_persistence.stores.file._locking import (
    LineMissing,
    hold_exclusively,
    locked_token,
    new_incarnation,
)
from step_persistence.stores.file._message_journal import MessageJournal, MessageVersion

__all__ = ['LineIndex', 'Lines', 'PickedMessage']


class LineIndex:
    """What a process knows of one line's files; use it only while holding `lock` and the line's lock."""

    def __init__(self, paths: LinePaths, base: LineBase | None) -> None:
        self.lock = threading.Lock()
        self.paths = paths
        self.base = base
        self.token: str | None = None
        self._start_over()

    @property
    def line_id(self) -> str:
        return self.paths.line_id

    def _start_over(self) -> None:
        self.messages = MessageJournal(self.paths.messages, base_length=0 if self.base is None else self.base.length)

    def adopt(self, token: str) -> None:
        """Start over if the line's file is not the one this index was built from (compacted since)."""
        if token != self.token:
            self.token = token
            self._start_over()


@dataclass(frozen=True)
class PickedMessage:
    """One message of a view as read: the line it was found in, its version, and its stored line's bytes."""

    line: str
    version: MessageVersion
    data: bytes


class Lines:
    """The history lines under a store's directory, with the indexes of the `capacity` most recently used."""

    def __init__(self, root: Path, io: FileIo, *, capacity: int) -> None:
        self.root = root
        self.io = io
        self._work = root / WORK_DIRECTORY_NAME
        self._indexes: BoundedLru[str, LineIndex] = BoundedLru(capacity)
        self._guard = threading.Lock()
        self.damage_epoch = 0
        """Bumped whenever a read finds a damaged message: a cached head may name its digest, so
        heads cached before are recomputed from the (rebuilt) line indexes."""

    @property
    def directory(self) -> Path:
        """`@lines/`, where every line's directory is."""
        return self.root / LINES_DIRECTORY_NAME

    # --- indexes and locks ---

    def _index(self, line: LineId) -> LineIndex:
        """The cached index of `line`, built (reading its `line.json`) if needed; `LineMissing` if
        the line has no directory, `ValueError` if its `line.json` is unreadable (or `line` is not an
        id the store makes)."""
        line_id = str(line)
        with self._guard:
            index = self._indexes.get(line_id)
        if index is not None:
            return index
        paths = line_paths(self.root, line_id)
        try:
            real_directory(paths.directory)
            base = load_line_file(self.io.read_all(paths.base_file))
        except FileNotFoundError:
            raise LineMissing(f'history line {line_id!r} is not stored') from None
        with self._guard:
            return self._indexes.get_or_build(line_id, partial(LineIndex, paths, base))

    def base_of(self, line: LineId) -> LineBase | None:
        """The base of `line` (`line.json` is written once, before the line is visible)."""
        return self._index(line).base

    @contextmanager
    def locked(self, line: LineId, *, exclusive: bool) -> Iterator[LineIndex]:
        """Hold the line's lock and yield its index, caught up with the file.

        Raises `LineMissing` if the line is not stored (also when it was removed while waiting).
        After any error the index is dropped, so the next use rebuilds it from the files.
        """
        real_directory(self.directory)
        index = self._index(line)
        paths = index.paths
        line_id = paths.line_id
        with index.lock:
            try:
                with locked_token(
                    paths.lock_file,
                    exclusive=exclusive,
                    io=self.io,
                    missing=lambda: LineMissing(f'history line {line_id!r} is not stored'),
                ) as token:
                    index.adopt(token)
                    index.messages.catch_up(self.io)
                    yield index
            except BaseException:
                self.forget(line_id)
                raise

    @contextmanager
    def created(self, base: LineBase | None) -> Iterator[LineIndex]:
        """Make a new line starting from `base` and yield its index, its lock held exclusively.

        The line is staged whole (base, lock, empty message file, marker directories), its lock
        taken, and renamed into `@lines/`: it appears already locked.
        """
        line_id = secrets.token_hex(16)
        self._work.mkdir(parents=True, exist_ok=True)
        real_directory(self._work)
        staging = LinePaths(self._work / f'line-{line_id}')
        staging.directory.mkdir()
        try:
            token = new_incarnation()
            self.io.create(staging.base_file, dump_line_file(base))
            self.io.create(staging.lock_file, token.encode('ascii'))
            self.io.create(staging.messages, b'')
            staging.users.mkdir()
            staging.children.mkdir()
            self.io.sync_directory(staging.directory)
            directory = line_paths(self.root, line_id).directory
            directory.parent.mkdir(exist_ok=True)
            real_directory(directory.parent)
            with hold_exclusively(staging.lock_file):
                self.io.barrier()  # the staged line whole before it appears
                os.rename(staging.directory, directory)
                self.io.sync_directory(directory.parent)
                index = LineIndex(LinePaths(directory), base)
                with index.lock:
                    index.adopt(token)
                    with self._guard:
                        self._indexes.put(line_id, index)
                    try:
                        yield index
                    except BaseException:
                        self.forget(line_id)
                        raise
        finally:
            shutil.rmtree(staging.directory, ignore_errors=True)

    def forget(self, line_id: str) -> None:
        """Drop the index of `line_id` (it is rebuilt from the files on next use)."""
        with self._guard:
            self._indexes.pop(line_id)

    def damaged(self, line_id: str) -> None:
        """A read found a damaged message in `line_id`: its index is rebuilt (without it) on next use."""
        with self._guard:
            self._indexes.pop(line_id)
            self.damage_epoch += 1

    def clear(self) -> None:
        with self._guard:
            self._indexes.clear()

    # --- markers, under the line's exclusive lock ---

    def add_user(self, index: LineIndex, run_id: str, incarnation: str) -> None:
        """Record that registration `incarnation` of `run_id` saves on the line (before its first commit there)."""
        self._mark(index.paths.users, index.paths.user(run_id, incarnation))

    def add_child(self, index: LineIndex, child: str) -> None:
        """Record that line `child` branches from this one (its base keeps rows of this line in use)."""
        self._mark(index.paths.children, index.paths.child(child))

    def _mark(self, directory: Path, marker: Path) -> None:
        real_directory(directory)
        try:
            self.io.create(marker, b'')
        except FileExistsError:
            return
        self.io.sync_directory(directory)

    # --- reading views ---

    def segments(self, view: LineView) -> list[ViewSegment]:
        """The lines `view` reads from (`view_segments`); `ValueError` on damaged bases."""
        return view_segments(view.line, view.length, view.through, self.base_of)

    def pick(self, view: LineView) -> list[PickedMessage]:
        """The stored messages of `view`, in order, with their lines' bytes.

        Raises `ValueError` if a position has no stored message (damaged or missing rows) or a line
        of the view is not stored.
        """
        resolved = [False] * view.length
        found: list[dict[int, PickedMessage]] = []
        for segment in self.segments(view):
            with self.locked(segment.line, exclusive=False) as index:
                picks = self._versions(index, segment, resolved)
                data = self.io.read_spans(index.paths.messages, [version.span for version in picks.values()])
            found.append(
                {
                    position: PickedMessage(index.line_id, version, line)
                    for (position, version), line in zip(picks.items(), data, strict=True)
                }
            )
        return assemble(view.length, found)

    def digests(self, view: LineView) -> list[str | None]:
        """The digest of each message of `view` (`None` for a position without a stored message);
        `ValueError` (or `LineMissing`) if a line of the view is damaged or not stored."""
        resolved = [False] * view.length
        digests: list[str | None] = [None] * view.length
        for segment in self.segments(view):
            with self.locked(segment.line, exclusive=False) as index:
                for position, version in self._versions(index, segment, resolved).items():
                    digests[position] = version.digest
        return digests

    @staticmethod
    def _versions(index: LineIndex, segment: ViewSegment, resolved: list[bool]) -> dict[int, MessageVersion]:
        """The versions `segment` serves for the positions no earlier segment did (marked resolved)."""
        picks: dict[int, MessageVersion] = {}
        for position in range(min(segment.length, len(index.messages.versions))):
            if resolved[position]:
                continue
            version = index.messages.version_at(position, segment.through)
            if version is not None:
                picks[position] = version
                resolved[position] = True
        return picks
