"""Saving a snapshot's history on a line: the head it builds on, then appending or branching.

Under the run's exclusive lock, a save:

1. finds its **head** (`step_persistence.stores._positions`): the view this process's last save of
   the run wrote (cached with its digests), else the view of the run's newest retained snapshot
   (digests read through the lines), else that of its origin snapshot (read from the origin run's
   journal without its lock; when the history starts with exactly the origin's history, as a
   chat's next turn does, its digests are the history's own and no message is read), else none;
2. takes the head line's exclusive lock. A head from the origin must still be **anchored**: the
   origin snapshot still retained with that view (checked again under the line's lock, which
   compaction also takes), otherwise the save starts over with no head and writes everything;
3. **appends** to the line when its newest row is still the head's `through` (or when nothing
   changed), otherwise makes a new line whose base is the head's view (**branch**), records it
   in the head line (so compaction keeps the base's rows) and releases the head line;
4. records the run as a user of the line, appends the rows (`MessageJournal.store`, the one place
   a plan becomes lines) and commits the snapshot (`commit`: its file, then its `snapshots.jsonl`
   line) before releasing the line: under a line's lock, every row belongs to a committed snapshot
   or to a save that crashed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from step_persistence._history import EncodedMessage, history_digest
from step_persistence.records import RunOrigin
from step_persistence.stores._media import PackedMessage
from step_persistence.stores._positions import RunHead, changed_positions
from step_persistence.stores.file._codec import LineView
from step_persistence.stores.file._index import RunIndex, read_snapshot_journal
from step_persistence.stores.file._io import FileIo
from step_persistence.stores.file._layout import RunPaths, run_paths
from step_persistence.stores.file._lines import LineIndex, Lines
from step_persistence.stores.file._locking import LineMissing

__all__ = ['HistorySaves']

Pack = Callable[[EncodedMessage], PackedMessage]


def _adds_nothing(digests: Sequence[str], head: RunHead) -> bool:
    """Whether the history is a prefix of the head's view (its view is then the head's, cut short)."""
    return len(digests) <= len(head.latest) and not changed_positions(digests, head.latest)


@dataclass(frozen=True)
class _Anchor:
    """The origin snapshot a head came from: the head is sound while it is retained with that view."""

    paths: RunPaths
    seq: int
    view: LineView

    def holds(self, io: FileIo) -> bool:
        return _retained_view(io, self.paths, self.seq) == self.view


def _retained_view(io: FileIo, paths: RunPaths, seq: int) -> LineView | None:
    """The view of snapshot `seq` of the run at `paths`, if it is retained (read without the run's lock)."""
    try:
        journal = read_snapshot_journal(io, paths)
    except ValueError:  # a symbolic link: never followed
        return None
    entry = None if journal is None else journal.entries.get(seq)
    return None if entry is None else entry.view


class HistorySaves:
    """Saves of snapshot histories on the lines of one store directory."""

    def __init__(self, io: FileIo, lines: Lines) -> None:
        self.io = io
        self.lines = lines

    def save(
        self, index: RunIndex, messages: Sequence[EncodedMessage], pack: Pack, commit: Callable[[LineView], None]
    ) -> None:
        """Store `messages` as the history of the run's next snapshot and `commit` it with its view.

        Call under the run's exclusive lock, its index caught up.
        """
        digests = [message.digest for message in messages]
        head, anchor = self._head(index, digests)
        while True:
            if head.line is None:
                with self.lines.created(None) as line:
                    self._write(index, line, RunHead(head.incarnation, line=line.line_id), messages, pack, commit)
                return
            try:
                with ExitStack() as branch:
                    with self.lines.locked(head.line, exclusive=True) as line:
                        if anchor is not None and not anchor.holds(self.io):
                            head, anchor = RunHead(head.incarnation), None
                            continue
                        if line.messages.last_no == head.last_no or _adds_nothing(digests, head):
                            self._write(index, line, head, messages, pack, commit)
                            return
                        child = branch.enter_context(self.lines.created(head.base()))
                        self.lines.add_child(line, child.line_id)
                    self._write(index, child, head.branched(child.line_id), messages, pack, commit)
                    return
            except LineMissing:
                head, anchor = RunHead(head.incarnation), None

    def _write(
        self,
        index: RunIndex,
        line: LineIndex,
        head: RunHead,
        messages: Sequence[EncodedMessage],
        pack: Pack,
        commit: Callable[[LineView], None],
    ) -> None:
        """Under `line`'s exclusive lock: the rows `messages` add on `head`, then the commit."""
        incarnation = str(index.incarnation)
        self.lines.add_user(line, index.paths.directory.name, incarnation)
        digests = [message.digest for message in messages]
        # A prefix of the head's view needs no row, and is valid whatever the line holds since.
        through = head.last_no if _adds_nothing(digests, head) else line.messages.store(self.io, head, messages, pack)
        commit(LineView(line.line_id, len(digests), through, history_digest(digests)))
        index.head = RunHead(incarnation, line=line.line_id, last_no=through, latest=list(digests))
        index.head_epoch = self.lines.damage_epoch

    def _head(self, index: RunIndex, digests: list[str]) -> tuple[RunHead, _Anchor | None]:
        """The head the run's next save builds on, and the origin anchoring it (if it came from there)."""
        incarnation = index.incarnation
        empty = RunHead(incarnation)
        newest = index.snapshots.newest
        if newest is not None:
            if newest.view is None:
                return empty, None  # written before lines: the next save starts a line of its own
            cached = index.head
            view = newest.view
            if (
                cached is not None
                and index.head_epoch == self.lines.damage_epoch
                and (cached.line, cached.last_no, len(cached.latest)) == (view.line, view.through, view.length)
            ):
                return cached, None
            return self._read(incarnation, view), None
        origin = self._origin(index)
        if origin is None:
            return empty, None
        try:
            paths = run_paths(index.paths.directory.parent, origin.run_id)
        except ValueError:
            return empty, None  # an origin no run of this store can have
        kept = _retained_view(self.io, paths, origin.seq)
        if kept is None:
            return empty, None
        shared = digests[: kept.length]
        if len(shared) == kept.length and history_digest(shared) == kept.digest:
            head = RunHead(incarnation, line=kept.line, last_no=kept.through, latest=list(shared))
        else:
            head = self._read(incarnation, kept)
        return head, _Anchor(paths, origin.seq, kept)

    def _read(self, incarnation: int | str | None, view: LineView) -> RunHead:
        """A head on `view`, its digests read through the lines (no head if they cannot be read)."""
        try:
            digests = self.lines.digests(view)
        except (ValueError, LineMissing):
            return RunHead(incarnation)
        return RunHead(incarnation, line=view.line, last_no=view.through, latest=digests)

    def _origin(self, index: RunIndex) -> RunOrigin | None:
        """The run's origin, from its `run.json` (`None` when unreadable: the save then writes everything)."""
        try:
            record = index.record(self.io)
        except (OSError, ValueError):
            return None
        return record.origin
