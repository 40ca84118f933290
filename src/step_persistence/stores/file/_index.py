"""What a process knows about each run's files, kept up to date incrementally.

Idempotency keys, retained snapshots with their views, sequence numbers and tool-effect records
are derived from the run's `.jsonl` files. A process builds them the first time it touches a run (one
full read), then only reads what was appended since, so an append costs the same on the first
step and the ten-thousandth.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from step_persistence.records import RunRecord, SnapshotState, ToolEffectRecord
from step_persistence.retention import retained_seqs
from step_persistence.stores._bare import looks_bare
from step_persistence.stores._positions import RunHead
from step_persistence.stores.file._codec import (
    LineView,
    SnapshotEntry,
    json_object,
    load_snapshot_journal_line,
)
from step_persistence.stores.file._io import FileIo, Span, real_directory
from step_persistence.stores.file._journal import Journal
from step_persistence.stores.file._layout import RunPaths
from step_persistence.stores.file._message_journal import MessageJournal
from step_persistence.stores.file._run_files import read_record, read_stamp

__all__ = ['EffectJournal', 'EventJournal', 'RunIndex', 'SnapshotJournal', 'read_snapshot_journal']


class EventJournal(Journal[str | None]):
    """`events.jsonl`, indexed by the idempotency keys its events used."""

    def clear(self) -> None:
        self.keys: set[str] = set()

    def parse(self, line: bytes) -> str | None:
        value = json_object(line, 'event line')
        if value.get('run_id') != self.run_id:
            raise ValueError(f'event line of run {value.get("run_id")!r}, not {self.run_id!r}')
        key = value.get('idempotency_key')
        if key is not None and not isinstance(key, str):
            raise ValueError(f'event line has a non-string idempotency_key {key!r}')
        return key

    def apply(self, entry: str | None, span: Span) -> None:
        if entry is not None:
            self.keys.add(entry)


class SnapshotJournal(Journal[SnapshotEntry]):
    """`snapshots.jsonl`, the commit log of snapshots: used keys, the next seq, the retained snapshots.

    Each line applies the retention of the store that wrote it, so every reader agrees on what is
    retained with the writers that deleted files, whatever its own `max_snapshots_per_run`.
    """

    def clear(self) -> None:
        self.keys: set[str] = set()
        self.retained: list[tuple[int, SnapshotState]] = []
        """`(seq, state)` of the snapshots retention keeps, ascending."""
        self.entries: dict[int, SnapshotEntry] = {}
        """The journal line of each retained snapshot, by seq."""
        self.next_seq = 1
        self.pruned: list[int] = []
        """Seqs that retention dropped since the last catch-up (their files are to be deleted)."""

    def parse(self, line: bytes) -> SnapshotEntry:
        return load_snapshot_journal_line(line)

    def apply(self, entry: SnapshotEntry, span: Span) -> None:
        if entry.idempotency_key is not None:
            self.keys.add(entry.idempotency_key)
        self.next_seq = max(self.next_seq, entry.seq + 1)
        self.entries[entry.seq] = entry
        if self.retained and entry.seq <= self.retained[-1][0]:
            self.retained = sorted({*self.retained, (entry.seq, entry.state)})
        else:
            self.retained.append((entry.seq, entry.state))
        if entry.retain is not None:
            keep = retained_seqs(self.retained, entry.retain)
            self.pruned.extend(seq for seq, _ in self.retained if seq not in keep)
            self.retained = [(seq, state) for seq, state in self.retained if seq in keep]
            self.entries = {seq: self.entries[seq] for seq, _ in self.retained}

    def catch_up(self, io: FileIo) -> None:
        self.pruned.clear()
        super().catch_up(io)

    @property
    def newest(self) -> SnapshotEntry | None:
        """The newest retained snapshot (any state): the view the run's next save builds on."""
        return self.entries[self.retained[-1][0]] if self.retained else None

    def views(self) -> Iterator[LineView]:
        """The views of the retained snapshots (those written before lines have none)."""
        return (entry.view for entry in self.entries.values() if entry.view is not None)


def read_snapshot_journal(io: FileIo, paths: RunPaths) -> SnapshotJournal | None:
    """Another run's `snapshots.jsonl`, read whole without its lock (it is only ever appended to);
    `None` if the run has none (deleted). `UnsafePath` if the run's directory or journal is a link."""
    journal = SnapshotJournal(paths.snapshot_journal, locked=False)
    try:
        real_directory(paths.directory)
        journal.catch_up(io)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return journal


class EffectJournal(Journal[ToolEffectRecord]):
    """`tool_effects.jsonl`, indexed by tool call id; each line is a whole merged record, so the last wins."""

    def clear(self) -> None:
        self.records: dict[str, ToolEffectRecord] = {}

    def parse(self, line: bytes) -> ToolEffectRecord:
        record = ToolEffectRecord.model_validate_json(line)
        if record.run_id != self.run_id:
            raise ValueError(f'tool effect line of run {record.run_id!r}, not {self.run_id!r}')
        return record

    def apply(self, entry: ToolEffectRecord, span: Span) -> None:
        self.records[entry.tool_call_id] = entry


class RunIndex:
    """Everything a process has derived from one run's files; use it only while holding `lock`."""

    def __init__(self, paths: RunPaths) -> None:
        self.lock = threading.Lock()
        self.paths = paths
        self.incarnation: str | None = None
        self.verified = False
        """Whether `run.json` was found to name this run (checked once per incarnation, see `RunSessions`)."""
        self._start_over()

    def _start_over(self) -> None:
        self.events = EventJournal(self.paths.events)
        self.snapshots = SnapshotJournal(self.paths.snapshot_journal)
        self.effects = EffectJournal(self.paths.tool_effects)
        self.legacy_messages = MessageJournal(self.paths.legacy_messages)
        """The run's own `messages.jsonl`, for snapshots written before history lines."""
        self.head: RunHead | None = None
        """The view this process's last save of the run wrote, with its digests (see `_saves`)."""
        self.head_epoch = 0
        self._record: RunRecord | None = None
        self._stamp: int | None = None

    def adopt(self, incarnation: str) -> None:
        """Start over if the run on disk is not the one this index was built from."""
        if incarnation != self.incarnation:
            self.incarnation = incarnation
            self.verified = False
            self._start_over()

    def record(self, io: FileIo) -> RunRecord:
        """The run's record (`run.json` is written once per incarnation, but for a bare run's, which its
        filling `register_run` replaces: that one is read each time)."""
        if self._record is not None:
            return self._record
        record, stamp = read_record(io, self.paths)
        if not looks_bare(record):
            self._record, self._stamp = record, stamp
        return record

    def stamp(self, io: FileIo) -> int:
        """The run's registration stamp (written once per incarnation, like its record)."""
        if self._stamp is None:
            self._stamp = read_stamp(io, self.paths)
        return self._stamp

    def catch_up_legacy(self, io: FileIo) -> MessageJournal:
        """The run's own `messages.jsonl`, caught up; `ValueError` if the run has none."""
        try:
            self.legacy_messages.catch_up(io)
        except FileNotFoundError:
            raise ValueError(f'{self.paths.legacy_messages} is missing') from None
        return self.legacy_messages
