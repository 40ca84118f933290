"""`FileStepStore`: a directory of plain JSON files, safe across threads and processes, flat cost per step."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from functools import cache, partial
from pathlib import Path
from typing import Any, TypeVar

import anyio.from_thread

from step_persistence import lifecycle
from step_persistence._arguments import require_text
from step_persistence._closing import ClosesOnExit
from step_persistence._history import EncodedMessage, decode_messages, history_digest
from step_persistence._reading import logger, read_each, read_or_skip
from step_persistence.media.disk import DiskMediaStore
from step_persistence.media.protocol import MediaStore
from step_persistence.protocol import write_each
from step_persistence.reclaiming import MediaCollection
from step_persistence.records import (
    ContinuableSnapshot,
    ConversationSummary,
    RunRecord,
    SnapshotRef,
    SnapshotState,
    StepEvent,
    StepWrites,
    ToolEffectRecord,
    merge_tool_effect,
)
from step_persistence.retention import validate_max_snapshots
from step_persistence.stores._bare import Write, bare_record, first_write
from step_persistence.stores._idempotency import first_per_key
from step_persistence.stores._listing import ConversationFilter, RunFilter, conversation_summaries
from step_persistence.stores._media import DEFAULT_THRESHOLD_BYTES, MediaSetting, MessageMedia, PackedMessage
from step_persistence.stores._pruning import PrunesOldRuns
from step_persistence.stores.file import reclaiming as file_reclaiming
from step_persistence.stores.file._all_runs import AllRunsIndex
from step_persistence.stores.file._codec import (
    LegacyHistory,
    LineView,
    SnapshotEntry,
    dump_snapshot_file,
    dump_snapshot_journal_line,
    load_snapshot_file,
)
from step_persistence.stores.file._conversations import ConversationIndex
from step_persistence.stores.file._index import RunIndex
from step_persistence.stores.file._io import FileIo, IoCounters, real_directory
from step_persistence.stores.file._journal import read_lines
from step_persistence.stores.file._layout import (
    MEDIA_DIRECTORY_NAME,
    RUN_FILE_NAME,
    WORK_DIRECTORY_NAME,
    Entry,
    RunPaths,
    is_run_directory_name,
    run_paths,
    start_of,
)
from step_persistence.stores.file._lines import Lines
from step_persistence.stores.file._locking import RunNotRegistered, new_incarnation
from step_persistence.stores.file._message_journal import MessageVersion
from step_persistence.stores.file._messages import DamagedMessage, stored_message
from step_persistence.stores.file._origins import OriginClaims
from step_persistence.stores.file._run_files import (
    dump_registration_file,
    dump_run_file,
    read_record,
    read_registration,
    read_run,
    read_stamp,
)
from step_persistence.stores.file._saves import HistorySaves
from step_persistence.stores.file._sessions import RunSessions, foreign_run_message
from step_persistence.stores.file._usage import LineUsage

__all__ = ['FileStepStore']

_Record = TypeVar('_Record', RunRecord, StepEvent, ContinuableSnapshot)
_Read = TypeVar('_Read')


def _of_run(run_id: str, what: str, record: _Record) -> _Record:
    """`record`, read from the files of run `run_id`; `ValueError` if it belongs to another run."""
    if record.run_id != run_id:
        raise ValueError(f'{what} of run {record.run_id!r}, not {run_id!r}')
    return record


INDEX_CACHE_CAPACITY = 256
"""How many runs' indexes a store keeps in memory; a run evicted from the cache is re-indexed on next use."""
LINE_INDEX_CACHE_CAPACITY = 256
"""How many history lines' indexes a store keeps in memory (likewise)."""

WORKER_THREADS = 40
"""How many worker threads one store uses at once. They are counted apart from anyio's default pool:
a save or read waiting in a worker thread for the media store (which may itself need a thread of
the default pool) can then never hold every thread that media store is waiting for."""


class _RegistrationClock:
    """Strictly increasing nanosecond stamps within this process, ordering runs registered at the same instant."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._last = max(time.time_ns(), self._last + 1)
            return self._last


_REGISTRATION_CLOCK = _RegistrationClock()


class _RunExists(Exception):
    """The directory of a run being created is there already."""


class FileStepStore(PrunesOldRuns, ClosesOnExit):
    """Stores runs as plain JSON files under `directory`, one directory per run.

    Every run id is validated (`[A-Za-z0-9_.-]{1,200}`, no `..`, not `.`) before the disk is
    touched; any method given an invalid one raises `ValueError` (`TypeError` for a run id or
    filter that is not a string), reads included. A run directory whose `run.json` names another
    run, and symbolic links below `directory`, are never used as the run. Writers of one
    run are serialized by a lock file, so several threads and processes can share a directory on
    a local filesystem (POSIX only); calls on one run take effect in the order they were made.
    Histories are stored in history lines shared across runs: a run continuing a stored snapshot
    (its `origin`, a chat's next turn) appends to that snapshot's line, so a conversation stores
    each message once. A snapshot writes only the messages that changed since the view it builds
    on and refers to its history in constant space, so the bytes read and written by
    `append_event`, `save_snapshot` and `record_tool_effect` do not grow with the run or the
    conversation (`io_counters` counts them). Listing runs (of the store, an agent or a
    conversation), conversations and finding a snapshot by its history go through an index on
    disk, not through every run.

    `fsync=True` (the default) makes every write durable before the call returns, so a power
    loss cannot lose an acknowledged write; `fsync=False` keeps writes safe against a crash of
    the process only, and is faster.

    `media_store='auto'` (the default) moves every binary payload, and every string of at least
    `media_threshold_bytes` UTF-8 bytes, to a `DiskMediaStore` in `media_directory`, once, when
    the message is first written; `messages.jsonl` keeps a marker. Pass another `MediaStore` to
    put them elsewhere, or `None` to keep everything inline. Reads put the original bytes and
    text back. Deleting a run or pruning snapshots never deletes media.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        media_store: MediaSetting = 'auto',
        media_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        fsync: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self._media = MessageMedia.resolve(
            media_store, media_threshold_bytes, default=lambda: DiskMediaStore(self.media_directory)
        )
        self._owns_media = media_store == 'auto'
        """Whether the media store is the default one under `@media`, which must then not be a link."""
        self.media_store: MediaStore | None = self._media.store
        """Where large message payloads go; `None` when they stay inline."""
        self.media_threshold_bytes = self._media.threshold_bytes
        self.max_snapshots_per_run = validate_max_snapshots(max_snapshots_per_run)
        if not isinstance(fsync, bool):
            raise ValueError(f'fsync must be True or False, got {fsync!r}')
        self.fsync = fsync
        self._io = FileIo(fsync=fsync)
        self._runs = RunSessions(self.directory, self._io, threads=WORKER_THREADS, index_capacity=INDEX_CACHE_CAPACITY)
        self._lines = Lines(self.directory, self._io, capacity=LINE_INDEX_CACHE_CAPACITY)
        self._saves = HistorySaves(self._io, self._lines)
        self._usage = LineUsage(self.directory, self._io, self._lines)
        self._conversations = ConversationIndex(self.directory, self._io)
        self._all_runs = AllRunsIndex(self.directory, self._io)
        self._origins = OriginClaims(self.directory, self._io)

    @property
    def media_directory(self) -> Path:
        """Where media blobs live: a name no run id can take, so no run can shadow it."""
        return self.directory / MEDIA_DIRECTORY_NAME

    @property
    def io_counters(self) -> IoCounters:
        """Bytes this store has read and written so far."""
        return self._io.counters

    def __repr__(self) -> str:
        return f'FileStepStore({str(self.directory)!r}, max_snapshots_per_run={self.max_snapshots_per_run!r})'

    def _check_media_directory(self) -> None:
        """Raise `UnsafePath` if the store's own `@media` is a symbolic link (blobs would go elsewhere)."""
        if self._owns_media:
            with contextlib.suppress(FileNotFoundError):  # created by the media store's first put
                real_directory(self.media_directory)

    def _pack(self, message: EncodedMessage) -> PackedMessage:
        """From a worker thread: a new message as it is written, its payloads stored in the media store.

        The media store is async, so the walker runs on the event loop while the thread waits; a message
        with nothing to move out (most) is packed here, without that round trip.
        """
        inline = self._media.packed_inline(message)
        if inline is not None:
            return inline
        self._check_media_directory()
        return anyio.from_thread.run(self._media.pack_message, message)

    def _unpack(self, version: MessageVersion, line: bytes) -> Any:
        """From a worker thread: the JSON tree of a stored message version from its line, checked
        against its digest, payloads put back."""
        tree, externalized = stored_message(version.number, version.digest, line)
        if not externalized:
            return tree
        self._check_media_directory()
        return anyio.from_thread.run(partial(self._media.unpack, tree, externalized=True))

    # --- runs ---

    async def register_run(self, record: RunRecord) -> None:
        await self._runs.in_turn(record.run_id, partial(self._register_run, record))

    def _register_run(self, record: RunRecord) -> None:
        """Create the run, or fill in its bare one; `ValueError` if it is registered already."""
        with self._io.grouped_syncs():
            if not self._create_run(record, bare=False):
                self._fill_bare_run(record)

    def _register_bare(self, first: Write) -> None:
        """Create the bare run `first`, its first write, registers (unless another writer just did)."""
        self._create_run(bare_record(first), bare=True)

    def _create_run(self, record: RunRecord, *, bare: bool) -> bool:
        """Stage the run's directory, claim its origin and index it, then rename it into place; `False` (and
        nothing changed) if the run's directory exists."""
        paths = run_paths(self.directory, record.run_id)
        staging = self._work_directory() / f'register-{secrets.token_hex(8)}'
        self._ensure_indexed()
        staging.mkdir()
        try:
            staged = RunPaths(staging)
            incarnation = new_incarnation()
            registered_ns = _REGISTRATION_CLOCK.next()
            with self._origins.claiming(record.origin, record.run_id, incarnation) as origin:
                stored = record if origin == record.origin else record.model_copy(update={'origin': origin})
                self._io.create(staged.lock_file, incarnation.encode('ascii'))
                self._io.create(staged.run_file, dump_run_file(stored))
                self._io.create(staged.registration_file, dump_registration_file(registered_ns, bare=bare))
                for journal in staged.journals:
                    self._io.create(journal, b'')
                staged.snapshots.mkdir()
                self._io.sync_directory(staging)
                with (
                    self._conversations.registering(stored, registered_ns, staged.run_file),
                    self._all_runs.registering(stored, registered_ns, staged.run_file),
                ):
                    self._io.barrier()  # the staged files and the index entries before the run appears
                    try:
                        os.rename(staging, paths.directory)
                    except OSError as error:
                        if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                            raise _RunExists from None
                        raise
                    self._io.sync_directory(self.directory)
        except _RunExists:  # the claims and entries are taken back by now
            return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True

    def _ensure_indexed(self) -> None:
        """Index every run of a store directory written before an index (once: each index then leaves its marker)."""
        every_run = cache(self._read_all_runs)
        self._conversations.ensure_indexed(every_run)
        self._all_runs.ensure_indexed(every_run)

    def _fill_bare_run(self, record: RunRecord) -> None:
        """Under the run's lock: claim its origin and index it, then replace its `run.json` and unmark it
        (`_run_files.py`); `ValueError` if the run is not bare. Its stamp, incarnation and files stay."""
        with self._runs.session(record.run_id, exclusive=True) as index:
            paths = index.paths
            registered_ns, bare = read_registration(self._io, paths)
            if not bare:
                raise ValueError(f'run {record.run_id!r} is already registered')
            replaced = index.record(self._io)
            staging = self._work_directory() / f'fill-{secrets.token_hex(8)}'
            staging.mkdir()
            try:
                with self._origins.claiming(record.origin, record.run_id, str(index.incarnation)) as origin:
                    stored = record if origin == record.origin else record.model_copy(update={'origin': origin})
                    staged = staging / RUN_FILE_NAME
                    self._io.create(staged, dump_run_file(stored))
                    with (
                        self._conversations.registering(stored, registered_ns, staged),
                        self._all_runs.registering(stored, registered_ns, staged, replacing=replaced),
                    ):
                        self._io.barrier()
                        os.rename(staged, paths.run_file)
                        self._io.sync_directory(paths.directory)
                    self._io.write_atomic(paths.registration_file, dump_registration_file(registered_ns))
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def _work_directory(self) -> Path:
        """`@tmp`, created if needed; `UnsafePath` if it is a symbolic link (staging would happen elsewhere)."""
        work = self.directory / WORK_DIRECTORY_NAME
        work.mkdir(parents=True, exist_ok=True)
        real_directory(work)
        return work

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        """The record, `None` if absent; raises `ValueError` if its `run.json` is unreadable, names
        another run, or the run's directory or `run.json` is a symbolic link."""
        run_paths(self.directory, run_id)
        return await self._runs.in_turn(run_id, partial(self._read_record, run_id))

    def _read_record(self, run_id: str) -> RunRecord | None:
        """The record in the directory of `run_id` (`run.json` alone); `None` if there is none."""
        paths = run_paths(self.directory, run_id)
        try:
            real_directory(paths.directory)
            record, _ = read_record(self._io, paths)
        except FileNotFoundError:
            return None
        if record.run_id != run_id:
            raise ValueError(foreign_run_message(paths, record.run_id))
        return record

    def _read_run(self, run_id: str) -> tuple[RunRecord, int] | None:
        """The record and registration stamp in the directory of `run_id`, known to be a real
        directory; `None` if there is none."""
        paths = run_paths(self.directory, run_id)
        try:
            record, registered_ns = read_run(self._io, paths)
        except FileNotFoundError:
            return None
        if record.run_id != run_id:
            raise ValueError(foreign_run_message(paths, record.run_id))
        return record, registered_ns

    def _read_listed(self, run_id: str) -> tuple[RunRecord, int | None] | None:
        """`_read_run`, reading `run.json` only: the stamp is `None` unless that file holds it."""
        paths = run_paths(self.directory, run_id)
        try:
            record, registered_ns = read_record(self._io, paths)
        except FileNotFoundError:
            return None
        if record.run_id != run_id:
            raise ValueError(foreign_run_message(paths, record.run_id))
        return record, registered_ns

    def _tie_stamp(self, run_id: str) -> int:
        """The registration stamp of a run listed among others with its `started_at` (0 if unreadable:
        the run is still listed, first among them)."""
        paths = run_paths(self.directory, run_id)
        stamp = read_or_skip(f'registration stamp of run {run_id!r}', partial(read_stamp, self._io, paths))
        return 0 if stamp is None else stamp

    async def list_runs(
        self,
        *,
        parent_run_id: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        origin_run_id: str | None = None,
        run_id_prefix: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[RunRecord]:
        """Matching runs, oldest first; a run whose `run.json` is unreadable is skipped and logged.

        Runs are found through an index (the conversation's with `conversation_id`, else the store's:
        of the parent, origin or agent when given) and read in order until `limit` match: with one of
        those filters (and `run_id_prefix`, tested on the names), only the `run.json` files returned
        are read. In a store directory written before the index, until its first write, every
        `run.json` is read.
        """
        chosen = RunFilter(
            parent_run_id=parent_run_id,
            conversation_id=conversation_id,
            agent_name=agent_name,
            origin_run_id=origin_run_id,
            run_id_prefix=run_id_prefix,
            limit=limit,
            newest_first=newest_first,
        )
        return await self._runs.in_thread(partial(self._list_runs, chosen))

    def _list_runs(self, chosen: RunFilter) -> list[RunRecord]:
        agent_name, newest_first = chosen.agent_name, chosen.newest_first
        conversation_id = chosen.conversation_id
        if conversation_id is not None and self._conversations.is_indexed():
            entries = self._conversations.entries(conversation_id, agent_name, newest_first=newest_first)
            return self._indexed_runs(chosen, entries, partial(self._conversations.record, conversation_id, agent_name))
        if conversation_id is None and self._all_runs.is_indexed():
            directory = self._all_runs.directory_for(chosen)
            entries = self._all_runs.entries(directory, newest_first=newest_first)
            return self._indexed_runs(chosen, entries, partial(self._all_runs.record, directory))
        return self._list_every_run(chosen)

    async def runs_started_before(self, cutoff: datetime) -> list[RunRecord] | None:
        """For `prune_runs`: the runs that started before `cutoff`, oldest first, through the run index (its
        entries' names carry the starts: only those runs are read); `None` in a store directory written
        before the index (every run is judged)."""
        return await self._runs.in_thread(partial(self._runs_started_before, cutoff))

    def _runs_started_before(self, cutoff: datetime) -> list[RunRecord] | None:
        if not self._all_runs.is_indexed():
            return None
        end, directory = start_of(cutoff), self._all_runs.directory_for(RunFilter())
        older = itertools.takewhile(
            lambda entry: entry.start < end, self._all_runs.entries(directory, newest_first=False)
        )
        return self._indexed_runs(RunFilter(), older, partial(self._all_runs.record, directory))

    def _indexed_runs(
        self, chosen: RunFilter, entries: Iterable[Entry], record_of: Callable[[Entry], RunRecord | None]
    ) -> list[RunRecord]:
        """`list_runs` through an index's `entries` (in its order): `record_of(entry)` read for each entry whose
        run id `chosen` admits, until `limit` match; an entry that is not its run any more (`None`) is passed,
        an unreadable one skipped and logged."""
        found: list[RunRecord] = []
        for entry in entries:
            if not chosen.admits_run_id(entry.run_id):
                continue
            path = os.path.join(self.directory, entry.run_id, RUN_FILE_NAME)
            record = read_or_skip(f'run file {path}', partial(record_of, entry))
            if record is not None and chosen.matches(record):
                found.append(record)
                if len(found) == chosen.limit:
                    break
        return found

    async def list_conversations(
        self, *, limit: int | None = None, newest_first: bool = True, agent_name: str | None = None
    ) -> list[ConversationSummary]:
        """Conversations by their newest run, through the index: reads only the summaries returned."""
        chosen = ConversationFilter(limit=limit, newest_first=newest_first, agent_name=agent_name)
        return await self._runs.in_thread(partial(self._list_conversations, chosen))

    def _list_conversations(self, chosen: ConversationFilter) -> list[ConversationSummary]:
        if not self._conversations.is_indexed():
            return conversation_summaries(self._read_all_runs(), chosen)
        return self._conversations.summaries(chosen)

    async def find_snapshot(self, *, conversation_id: str, history_digest: str) -> SnapshotRef | None:
        """The conversation's runs are looked at newest first, each through its snapshot journal (which
        holds every retained snapshot's history digest), until one has the history."""
        require_text('conversation_id', conversation_id)
        require_text('history_digest', history_digest)
        return await self._runs.in_thread(partial(self._find_snapshot, conversation_id, history_digest))

    def _find_snapshot(self, conversation_id: str, digest: str) -> SnapshotRef | None:
        candidates: Iterable[tuple[str, Entry | None]]
        if self._conversations.is_indexed():
            entries = self._conversations.entries(conversation_id, None, newest_first=True)
            candidates = ((entry.run_id, entry) for entry in entries)
        else:  # a directory written before the index: the conversation's runs, found by reading every run
            chosen = RunFilter(conversation_id=conversation_id, newest_first=True)
            candidates = ((record.run_id, None) for record in self._list_every_run(chosen))
        for run_id, entry in candidates:
            find = partial(self._find_in_run, conversation_id, digest, entry)
            look = partial(self._runs.read, run_id, find, None)
            found = read_or_skip(f'snapshots of run {run_id!r}', look)
            if found is not None:
                return found
        return None

    def _find_in_run(
        self, conversation_id: str, digest: str, entry: Entry | None, index: RunIndex
    ) -> SnapshotRef | None:
        """The newest snapshot of the run with the history `digest`; through an index `entry`, only while it is
        that run's current registration."""
        if entry is not None and not self._conversations.is_current(conversation_id, None, entry):
            return None
        record = index.record(self._io)
        if record.conversation_id != conversation_id:
            return None
        index.snapshots.catch_up(self._io)
        for seq in sorted(index.snapshots.entries, reverse=True):
            view = index.snapshots.entries[seq].view
            found = view.digest if view is not None else self._legacy_digest(index, seq)
            if found == digest:
                return SnapshotRef(run_id=record.run_id, seq=seq)
        return None

    def _legacy_digest(self, index: RunIndex, seq: int) -> str | None:
        """The history digest of snapshot `seq`, written before lines (`None` if it cannot be read)."""
        try:
            _, history = load_snapshot_file(self._io.read_all(index.paths.snapshot(seq)))
            if not isinstance(history, LegacyHistory):
                return None
            versions = index.catch_up_legacy(self._io).resolve(history)
        except (OSError, ValueError):
            return None
        return history_digest(version.digest for version in versions)

    def _list_every_run(self, chosen: RunFilter) -> list[RunRecord]:
        """`list_runs` in a store directory written before the index: every `run.json` is read, and the
        registration stamps of only the matching runs that share their `started_at` with another (the only
        order a stamp decides)."""
        found = [pair for pair in self._each_run(self._read_listed, chosen.admits_run_id) if chosen.matches(pair[0])]
        shared = Counter(record.started_at for record, _ in found)

        def stamped(record: RunRecord, stamp: int | None) -> int:
            if stamp is not None:
                return stamp
            return self._tie_stamp(record.run_id) if shared[record.started_at] > 1 else 0

        return chosen.select((record, stamped(record, stamp)) for record, stamp in found)

    def _read_all_runs(self) -> list[tuple[RunRecord, int]]:
        """Every run's record and registration stamp (to index a directory written before the index)."""
        return self._each_run(self._read_run)

    def _each_run(
        self, read: Callable[[str], _Read | None], wanted: Callable[[str], bool] = lambda run_id: True
    ) -> list[_Read]:
        """`read(run_id)` of every run directory whose name is `wanted`, in name order; unreadable ones skipped
        and logged."""
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        names: list[str] = []
        for entry in entries:
            if not is_run_directory_name(entry.name) or not wanted(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                names.append(entry.name)
            elif entry.is_symlink():
                logger.warning('skipping %s: a symbolic link; the file store never follows links', entry.path)
        directory = os.fspath(self.directory)
        return read_each(
            sorted(names),
            # Paths as strings, not `Path`s: a third of the time.
            lambda name: f'run file {os.path.join(directory, name, RUN_FILE_NAME)}',
            read,
        )

    async def delete_run(self, *, run_id: str, cascade: bool = False) -> None:
        """Remove the run's directory in one rename (then delete it); with `cascade`, its delegated runs first."""
        run_paths(self.directory, run_id)
        if cascade:
            await lifecycle.delete_delegated_runs(self, run_id, every_run=await self.list_runs())
        await self._runs.in_turn(run_id, partial(self._delete_run, run_id))

    def _delete_run(self, run_id: str) -> None:
        """Rename the run's directory away under its lock, then take it out of the conversation index,
        free the snapshot it continued, and remove the lines its snapshots were on that no view uses."""
        paths = run_paths(self.directory, run_id)
        try:
            with self._runs.session(run_id, exclusive=True) as index:
                incarnation = str(index.incarnation)
                record = read_or_skip(f'run file {paths.run_file}', partial(index.record, self._io))
                stamp = read_or_skip(f'registration of run {run_id!r}', partial(index.stamp, self._io))
                lines = read_or_skip(f'snapshot journal {paths.snapshot_journal}', partial(self._lines_of, index))
                trash = self._work_directory() / f'deleted-{secrets.token_hex(8)}'
                os.rename(paths.directory, trash)
                self._io.sync_directory(self.directory)
        except RunNotRegistered:
            return
        finally:
            self._runs.forget(run_id)
        if record is not None:
            if stamp is not None:
                self._conversations.remove(record, stamp)
                self._all_runs.remove(record, stamp)
            self._origins.release(record.origin, run_id, incarnation)
        for line in sorted(lines or ()):
            self._usage.remove_if_unused(line, user=(run_id, incarnation))
        shutil.rmtree(trash, ignore_errors=True)

    def _lines_of(self, index: RunIndex) -> set[str]:
        index.snapshots.catch_up(self._io)
        return {view.line for view in index.snapshots.views()}

    async def _write(self, first: Write, write: Callable[[RunIndex], None]) -> None:
        """`write(index)` of the run of `first` (the call's first write), registering the run bare if it is
        not stored."""
        await self._runs.write(first.run_id, write, register=partial(self._register_bare, first))

    # --- events ---

    async def append_event(self, event: StepEvent) -> None:
        await self._write(event, partial(self._append_events, events=[event]))

    def _append_events(self, index: RunIndex, events: Sequence[StepEvent]) -> None:
        """Append `events` in one write, but those whose idempotency key the run (or an earlier one of them) used."""
        journal = index.events
        journal.catch_up(self._io)
        fresh = (event for event in first_per_key(events) if event.idempotency_key not in journal.keys)
        journal.append(self._io, [(event.model_dump_json().encode(), event.idempotency_key) for event in fresh])

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        """The run's events in append order; unreadable lines are skipped and logged."""
        run_paths(self.directory, run_id)
        return await self._runs.in_turn(run_id, partial(self._list_events, run_id))

    def _list_events(self, run_id: str) -> list[StepEvent]:
        path = run_paths(self.directory, run_id).events
        data = self._runs.read(run_id, lambda index: self._io.read_all(path), absent=b'')
        return read_each(
            read_lines(path, data),
            lambda line: f'line at byte {line[0][0]} of {path}',
            lambda line: _of_run(run_id, 'event line', StepEvent.model_validate_json(line[1])),
        )

    # --- snapshots ---

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._write(snapshot, partial(self._save_snapshot, snapshot=snapshot))

    def _save_snapshot(self, index: RunIndex, snapshot: ContinuableSnapshot) -> None:
        key = snapshot.idempotency_key
        journal = index.snapshots
        journal.catch_up(self._io)
        if key is not None and key in journal.keys:
            return
        real_directory(index.paths.snapshots)
        seq = journal.next_seq
        retain = self.max_snapshots_per_run

        def commit(view: LineView) -> None:
            # Written in place: no reader opens snapshot `seq` before the journal line commits it.
            self._io.write_uncommitted(index.paths.snapshot(seq), dump_snapshot_file(snapshot, seq, view))
            self._io.barrier()  # the snapshot's rows, its file and the step's other writes before its commit
            entry = SnapshotEntry(seq=seq, state=snapshot.state, idempotency_key=key, retain=retain, view=view)
            journal.append(self._io, [(dump_snapshot_journal_line(snapshot, seq, retain, view), entry)])
            self._io.barrier()  # committed and durable before the line's lock is released

        self._saves.save(index, snapshot.encoded_messages(), self._pack, commit)
        for pruned in journal.pruned:
            index.paths.snapshot(pruned).unlink(missing_ok=True)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest readable matching snapshot; unreadable newer ones are skipped and logged."""
        found = await self._snapshots(run_id, include_interrupted=include_interrupted, newest_only=True)
        return found[0] if found else None

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """Retained matching snapshots in sequence order; unreadable ones are skipped and logged."""
        return await self._snapshots(run_id, include_interrupted=include_interrupted, newest_only=False)

    async def list_snapshot_states(self, *, run_id: str) -> list[SnapshotState]:
        """The states `snapshots.jsonl` committed the retained snapshots with; no snapshot file is read."""
        run_paths(self.directory, run_id)
        none: list[SnapshotState] = []
        return await self._runs.read_in_turn(run_id, self._retained_states, absent=none)

    def _retained_states(self, index: RunIndex) -> list[SnapshotState]:
        index.snapshots.catch_up(self._io)
        return [state for _, state in index.snapshots.retained]

    async def _snapshots(
        self, run_id: str, *, include_interrupted: bool, newest_only: bool
    ) -> list[ContinuableSnapshot]:
        run_paths(self.directory, run_id)
        read = partial(self._matching_snapshots, include_interrupted=include_interrupted, newest_only=newest_only)
        none: list[ContinuableSnapshot] = []
        return await self._runs.read_in_turn(run_id, read, absent=none)

    def _matching_snapshots(
        self, index: RunIndex, *, include_interrupted: bool, newest_only: bool
    ) -> list[ContinuableSnapshot]:
        """The readable retained snapshots (only the newest one with `newest_only`), in sequence order."""
        index.snapshots.catch_up(self._io)
        chosen = [(seq, state) for seq, state in index.snapshots.retained if include_interrupted or state == 'complete']

        def describe(entry: tuple[int, SnapshotState]) -> str:
            return f'snapshot {index.paths.snapshot(entry[0])}'

        if not newest_only:
            return read_each(chosen, describe, partial(self._load_snapshot, index))
        for entry in reversed(chosen):
            snapshot = read_or_skip(describe(entry), partial(self._load_snapshot, index, entry))
            if snapshot is not None:
                return [snapshot]
        return []

    def _load_snapshot(self, index: RunIndex, entry: tuple[int, SnapshotState]) -> ContinuableSnapshot:
        """Snapshot `seq` in the state and with the view its `snapshots.jsonl` line committed it with (`entry`)."""
        seq, state = entry
        real_directory(index.paths.snapshots)
        header, history = load_snapshot_file(self._io.read_all(index.paths.snapshot(seq)))
        if header.seq != seq:
            raise ValueError(f'the file of snapshot {seq} holds snapshot {header.seq}')
        if header.state != state:
            raise ValueError(f'the file of snapshot {seq} says {header.state!r}, snapshots.jsonl {state!r}')
        run_id = index.paths.directory.name
        _of_run(run_id, 'snapshot file', header)
        if (history if isinstance(history, LineView) else None) != index.snapshots.entries[seq].view:
            raise ValueError(f'the file of snapshot {seq} names another history than snapshots.jsonl')
        found: list[tuple[str | None, MessageVersion, bytes]]
        if isinstance(history, LegacyHistory):
            versions = index.catch_up_legacy(self._io).resolve(history)
            stored = self._io.read_spans(index.paths.legacy_messages, [version.span for version in versions])
            found = [(None, version, data) for version, data in zip(versions, stored, strict=True)]
        else:
            picked = self._lines.pick(history)
            if history_digest(message.version.digest for message in picked) != history.digest:
                raise ValueError('the stored messages do not match the snapshot (a damaged or missing message line)')
            found = [(message.line, message.version, message.data) for message in picked]
        trees = []
        for line, version, data in found:
            try:
                trees.append(self._unpack(version, data))
            except DamagedMessage:
                # Damaged since this process indexed it: rebuilt from the file, the index leaves the line
                # out, so the next save writes that message again rather than reusing the damaged line.
                if line is not None:
                    self._lines.damaged(line)
                self._runs.forget(run_id)
                raise
        return header.model_copy(update={'messages': decode_messages(trees)})

    # --- tool effects ---

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._write(record, partial(self._record_tool_effects, records=[record]))

    def _record_tool_effects(self, index: RunIndex, records: Sequence[ToolEffectRecord]) -> None:
        """Upsert `records` in order, appending the merged records in one write."""
        journal = index.effects
        journal.catch_up(self._io)
        merged: dict[str, ToolEffectRecord] = {}
        lines: list[tuple[bytes, ToolEffectRecord]] = []
        for record in records:
            call_id = record.tool_call_id
            upserted = merge_tool_effect(merged.get(call_id) or journal.records.get(call_id), record)
            merged[call_id] = upserted
            lines.append((upserted.model_dump_json().encode(), upserted))
        journal.append(self._io, lines)

    # --- batches ---

    async def write_batch(self, writes: StepWrites) -> None:
        """Apply `writes` as the individual calls in their order would (tool effects, events, snapshots).

        The writes of one run take one turn and one lock, and each journal gets them in one append
        (one fsync). Not atomic: a crash keeps the writes that landed before it, in that order.
        Writes to several runs are applied call by call.
        """
        run_ids = {effect.run_id for effect in writes.tool_effects} | {event.run_id for event in writes.events}
        run_ids |= {snapshot.run_id for snapshot in writes.snapshots}
        if len(run_ids) != 1:
            await write_each(self, writes)
            return
        first = first_write(writes.tool_effects, writes.events, writes.snapshots)
        await self._write(first, partial(self._write_batch, writes=writes))

    def _write_batch(self, index: RunIndex, writes: StepWrites) -> None:
        self._record_tool_effects(index, writes.tool_effects)
        self._append_events(index, writes.events)
        for snapshot in writes.snapshots:
            self._save_snapshot(index, snapshot)

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        run_paths(self.directory, run_id)
        require_text('tool_call_id', tool_call_id)
        records = await self._tool_effects(run_id)
        return records.get(tool_call_id)

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        records = await self._tool_effects(run_id)
        unresolved = [record for record in records.values() if record.status == 'started']
        return sorted(unresolved, key=lambda record: record.started_at)

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        records = await self._tool_effects(run_id)
        return sorted(records.values(), key=lambda record: (record.started_at, record.tool_call_id))

    async def _tool_effects(self, run_id: str) -> dict[str, ToolEffectRecord]:
        """A copy of the run's ledger, by tool call id (empty for an unknown run)."""
        run_paths(self.directory, run_id)
        return await self._runs.read_in_turn(run_id, self._ledger, absent={})

    def _ledger(self, index: RunIndex) -> dict[str, ToolEffectRecord]:
        index.effects.catch_up(self._io)
        return dict(index.effects.records)

    # --- reclaiming ---

    async def collect_media(self, *, grace: timedelta) -> MediaCollection:
        """Drop message rows no view uses, then unreferenced blobs (see `stores/file/reclaiming.py`)."""
        return await file_reclaiming.collect_media(self._runs, self._lines, self._usage, self.media_store, grace=grace)

    # --- lifetime ---

    async def aclose(self) -> None:
        """Forget the cached indexes and let the threads flushing files end; the store holds no open files
        between calls and stays usable."""
        self._runs.clear()
        self._lines.clear()
        self._io.close()
