"""Which views use a history line's rows, and removing lines no view uses.

A line's rows are used by the views of its users' retained snapshots (each user run has a marker
in the line's `users/`; its views are in its `snapshots.jsonl`, read without its lock) and by the
bases of the lines branching from it (each has a marker in `children/`). Both are read under the
line's exclusive lock: a save commits on the line under that lock, and a branch is recorded under
it, so no view can appear meanwhile. Markers of runs or lines that are gone are removed then.

A line left with no view is removed whole, then its base line is looked at the same way (it lost
a child). Which rows of a line still in use are used (`used_numbers`) is for `collect_media`.
"""

from __future__ import annotations

import os
import secrets
import shutil
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from step_persistence._reading import logger
from step_persistence.stores._positions import LineId
from step_persistence.stores.file._index import read_snapshot_journal
from step_persistence.stores.file._io import FileIo, UnsafePath, real_directory
from step_persistence.stores.file._layout import (
    WORK_DIRECTORY_NAME,
    is_run_directory_name,
    require_line_id,
    run_paths,
)
from step_persistence.stores.file._lines import LineIndex, Lines
from step_persistence.stores.file._locking import LineMissing
from step_persistence.stores.file._message_journal import MessageVersion

__all__ = ['LineUsage', 'used_numbers']

View = tuple[int, int]
"""`(length, through)` of a view of one line."""


def used_numbers(versions: Sequence[Sequence[MessageVersion]], views: Iterable[View]) -> set[int]:
    """The numbers of the rows some view uses: per position, the newest row numbered at most a view's
    `through`, for views longer than the position.

    A row at position `p` numbered `n`, followed at `p` by a row numbered `m` (or none), is used
    exactly when a view longer than `p` has its `through` in `[n, m)`: one range-maximum query over
    the views sorted by `through`, so the cost is that of sorting the views plus a logarithm per row,
    not rows times views.
    """
    ordered = sorted(views, key=lambda view: view[1])
    throughs = [through for _, through in ordered]
    longest = _RangeMaximum([length for length, _ in ordered])
    used: set[int] = set()
    for position, stored in enumerate(versions):
        for rank, version in enumerate(stored):
            low = bisect_left(throughs, version.number)
            high = len(throughs) if rank + 1 == len(stored) else bisect_left(throughs, stored[rank + 1].number)
            if longest.over(low, high) > position:
                used.add(version.number)
    return used


class _RangeMaximum:
    """Maximum of `values[low:high]` in constant time, after an `n log n` build (a sparse table)."""

    def __init__(self, values: list[int]) -> None:
        self._levels = [values]
        width = 1
        while 2 * width <= len(values):
            previous = self._levels[-1]
            self._levels.append([max(previous[i], previous[i + width]) for i in range(len(previous) - width)])
            width *= 2

    def over(self, low: int, high: int) -> int:
        """The maximum of `values[low:high]`; -1 for an empty range."""
        if low >= high:
            return -1
        level = (high - low).bit_length() - 1
        row = self._levels[level]
        return max(row[low], row[high - (1 << level)])


class LineUsage:
    """The views using each line of a store directory, and the removal of lines left without any."""

    def __init__(self, root: Path, io: FileIo, lines: Lines) -> None:
        self.root = root
        self.io = io
        self.lines = lines

    def views(self, index: LineIndex) -> list[View]:
        """Every view using rows of the line (under its exclusive lock); `ValueError` if a user's
        snapshots cannot be read (a symbolic link) or a child's base is damaged."""
        return list(self._views(index))

    def _views(self, index: LineIndex) -> Iterator[View]:
        paths = index.paths
        for name in self.io.list_directory(paths.users):
            run_id, _, _ = name.rpartition('.')
            if not is_run_directory_name(run_id):
                continue
            journal = read_snapshot_journal(self.io, run_paths(self.root, run_id))
            if journal is None:
                self._unmark(paths.users / name)  # the run is gone
                continue
            yield from ((view.length, view.through) for view in journal.views() if view.line == index.line_id)
        for name in self.io.list_directory(paths.children):
            try:
                base = self.lines.base_of(require_line_id(name))
            except LineMissing:
                self._unmark(paths.children / name)  # the branch is gone
                continue
            if base is not None and base.line == index.line_id:
                yield base.length, base.through

    def _in_use(self, index: LineIndex) -> bool:
        try:
            return any(True for _ in self._views(index))
        except ValueError:
            return True  # what cannot be read may use it

    def _unmark(self, marker: Path) -> None:
        """Remove a marker of a run or line that is gone (never through a symbolic link)."""
        try:
            real_directory(marker.parent)
        except (FileNotFoundError, UnsafePath) as error:
            logger.warning('leaving %s: %s', marker, error)
            return
        marker.unlink(missing_ok=True)
        self.io.sync_directory(marker.parent)

    def remove_if_unused(self, line_id: LineId, *, user: tuple[str, str] | None = None) -> int:
        """Remove the line if no view uses it, then its base the same way; how many rows went.

        `user`: `(run_id, incarnation)` of a deleted run, whose marker goes first.
        """
        removed = 0
        gone: str | None = None
        current = line_id
        while True:
            try:
                with self.lines.locked(current, exclusive=True) as index:
                    if user is not None:
                        self._unmark(index.paths.user(*user))
                        user = None
                    if gone is not None:
                        self._unmark(index.paths.child(gone))
                    gone = index.line_id
                    if self._in_use(index):
                        return removed
                    base = index.base
                    removed += sum(map(len, index.messages.versions))
                    trash = self._discard(index)
            except LineMissing:
                return removed
            self.lines.forget(str(current))
            shutil.rmtree(trash, ignore_errors=True)
            if base is None:
                return removed
            current = base.line

    def _discard(self, index: LineIndex) -> Path:
        """Move the line's directory out of `@lines/` (one rename, under its lock); where it went."""
        work = self.root / WORK_DIRECTORY_NAME
        work.mkdir(exist_ok=True)
        real_directory(work)
        trash = work / f'deleted-line-{secrets.token_hex(8)}'
        os.rename(index.paths.directory, trash)
        self.io.sync_directory(index.paths.directory.parent)
        return trash
