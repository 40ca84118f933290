"""The conversation index: a conversation's runs, and conversations by their newest run, without reading every run.

**Entries.** Each run with a `conversation_id` has an entry in `@conversations/<key>/runs/` (and,
with an `agent_name`, in `agents/<agent key>/`): a hard link to its `run.json`, made, checked and
read as `_entries.py` says (names sort in `list_runs` order).

**Markers.** Per conversation (and per agent within it) one empty file `@latest/<scope>/<start>.<key>`
is named by the start of its newest run, so the conversations with the newest runs are found by
listing one directory and reading only the summaries returned. A marker is never below the truth:
it is raised before a run's directory appears and lowered after one disappears (under the
conversation's lock, which also serializes registrations and deletions of its runs). A marker
above the truth (a crash between the two steps) is noticed when listed (its conversation's newest
run is older than the marker says) and repaired; `latest.<scope>` in the conversation's directory
names the start its marker carries, so updates need not search for it.

**Older directories.** A store directory written before the index has none: its first write indexes
every run once (and says so in `@indexed`, an `IndexMarker`); until then reads look at every run
(reading never writes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path

from step_persistence._reading import read_or_skip
from step_persistence.records import ConversationSummary, RunRecord
from step_persistence.stores._listing import ConversationFilter
from step_persistence.stores.file._codec import dump_conversation_file, load_conversation_file
from step_persistence.stores.file._entries import EntryLinks, IndexMarker
from step_persistence.stores.file._io import FileIo, real_directory
from step_persistence.stores.file._layout import (
    ALL_AGENTS,
    CONVERSATIONS_DIRECTORY_NAME,
    INDEXED_MARKER_NAME,
    LATEST_DIRECTORY_NAME,
    ConversationPaths,
    Entry,
    start_of,
    started_at_of,
    text_key,
)
from step_persistence.stores.file._locking import locked_file

__all__ = ['ConversationIndex']

_ATTEMPTS = 3
"""Listings of the markers `summaries` makes at most, repairing stale ones in between."""


def _scopes(record: RunRecord) -> list[str]:
    """The scopes a run is indexed in: its conversation's, and its agent's within it."""
    return [ALL_AGENTS] if record.agent_name is None else [ALL_AGENTS, text_key(record.agent_name)]


def _scope(agent_name: str | None) -> str:
    """The scope listing the conversation's runs of `agent_name` (`None`: all its runs)."""
    return ALL_AGENTS if agent_name is None else text_key(agent_name)


class ConversationIndex:
    """The conversation index of the store directory `root`."""

    def __init__(self, root: Path, io: FileIo) -> None:
        self.root = root
        self.io = io
        self.links = EntryLinks(root, io)
        self.marker = IndexMarker(root, root / INDEXED_MARKER_NAME, io)

    def _paths(self, conversation_id: str) -> ConversationPaths:
        return ConversationPaths(self.root / CONVERSATIONS_DIRECTORY_NAME / text_key(conversation_id))

    def _markers(self, scope: str) -> Path:
        return self.root / LATEST_DIRECTORY_NAME / scope

    # --- writing, each under the conversation's lock ---

    @contextmanager
    def _locked(self, paths: ConversationPaths, conversation_id: str | None = None) -> Iterator[None]:
        """Hold the conversation's lock (made with its directory, and its id file when `conversation_id`)."""
        if conversation_id is not None:
            paths.directory.mkdir(parents=True, exist_ok=True)
        real_directory(paths.directory)
        with locked_file(
            paths.lock_file,
            exclusive=True,
            flags=os.O_RDONLY | os.O_CREAT,
            missing=lambda: FileNotFoundError(f'{paths.lock_file} vanished'),  # O_CREAT: never raised
        ):
            if conversation_id is not None and not paths.id_file.exists():
                self.io.write_atomic(paths.id_file, dump_conversation_file(conversation_id))
            yield

    @contextmanager
    def registering(self, record: RunRecord, registered_ns: int, run_file: Path) -> Iterator[None]:
        """Index `record` (registered as `registered_ns`, its `run.json` staged at `run_file`) around the
        block that puts its directory in place; if the block raises, the entries are taken back."""
        if record.conversation_id is None:
            yield
            return
        paths = self._paths(record.conversation_id)
        entry = Entry(start_of(record.started_at), registered_ns, record.run_id)
        with self._locked(paths, record.conversation_id):
            linked: list[Path] = []
            try:
                for scope in _scopes(record):
                    self._raise(paths, scope, entry.start)
                    self.links.link(paths.entries(scope), entry, run_file, replace=True)
                    linked.append(paths.entries(scope))
                yield
            except BaseException:
                for directory in linked:
                    self.links.take_back(directory, entry)
                for scope in _scopes(record):
                    self._settle(paths, scope)
                raise

    def remove(self, record: RunRecord, registered_ns: int) -> None:
        """Take a deleted run (its directory gone already) out of the index."""
        if record.conversation_id is None:
            return
        paths = self._paths(record.conversation_id)
        if not paths.directory.exists():
            return
        entry = Entry(start_of(record.started_at), registered_ns, record.run_id)
        with self._locked(paths):
            for scope in _scopes(record):
                self.links.unlink(paths.entries(scope), entry)
                self._settle(paths, scope)

    def _state(self, paths: ConversationPaths, scope: str) -> int | None:
        """The start the scope's marker carries, as `latest.<scope>` says (`None`: no marker)."""
        try:
            text = self.io.read_all(paths.latest(scope))
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None

    def _raise(self, paths: ConversationPaths, scope: str, start: int) -> None:
        """Make the scope's marker at least `start` (before a run starting then appears)."""
        current = self._state(paths, scope)
        if current is None or current < start:
            self._move(paths, scope, current, start)

    def _settle(self, paths: ConversationPaths, scope: str, *, search: bool = False) -> None:
        """Put the scope's marker where its newest run starts (after runs disappeared), or remove it.

        `search`: also remove every other marker of the conversation (repairing after a crash).
        """
        directory = paths.entries(scope)
        newest = next(self.links.valid(directory, newest_first=True), None)
        truth = None if newest is None else newest.start
        current = self._state(paths, scope)
        if search:
            suffix = f'.{paths.key}'
            markers = self._markers(scope)
            for name in self.io.list_directory(markers):
                if name.endswith(suffix) and name != self._marker_name(truth, paths.key):
                    (markers / name).unlink(missing_ok=True)
            current = None
        if current != truth or search:
            self._move(paths, scope, current, truth)

    @staticmethod
    def _marker_name(start: int | None, key: str) -> str:
        return '' if start is None else f'{start:019d}.{key}'

    def _move(self, paths: ConversationPaths, scope: str, old: int | None, new: int | None) -> None:
        """Rename the scope's marker from `old` to `new` (`None`: no marker), then record `new`."""
        directory = self._markers(scope)
        directory.mkdir(parents=True, exist_ok=True)
        real_directory(directory)
        target = directory / self._marker_name(new, paths.key)
        try:
            if old is None:
                raise FileNotFoundError
            source = directory / self._marker_name(old, paths.key)
            if new is None:
                source.unlink()
            else:
                os.rename(source, target)
        except FileNotFoundError:
            if new is not None:
                with suppress(FileExistsError):
                    self.io.create(target, b'')
        self.io.sync_directory(directory)
        state = paths.latest(scope)
        if new is None:
            state.unlink(missing_ok=True)
        else:
            self.io.write_hint(state, b'%d' % new)  # lost or stale, it costs a repair

    # --- reading ---

    def is_current(self, conversation_id: str, agent_name: str | None, entry: Entry) -> bool:
        """Whether an entry of `entries(conversation_id, agent_name, ...)` stands for the run's current
        registration (two `lstat`s; a copy of the store without its hard links reads the stamp)."""
        return self.links.is_valid(self._paths(conversation_id).entries(_scope(agent_name)), entry)

    def record(self, conversation_id: str, agent_name: str | None, entry: Entry) -> RunRecord | None:
        """The record of the run an entry of `entries(conversation_id, agent_name, ...)` stands for
        (`EntryLinks.record`)."""
        return self.links.record(self._paths(conversation_id).entries(_scope(agent_name)), entry)

    def entries(self, conversation_id: str, agent_name: str | None, *, newest_first: bool) -> Iterator[Entry]:
        """The entries of the conversation's runs (of `agent_name`'s, when given), in `list_runs` order
        (or its reverse).

        Not checked: the caller reads each run's record, which says whether it is still that run.
        """
        directory = self._paths(conversation_id).entries(_scope(agent_name))
        return self.links.listed(directory, newest_first=newest_first)

    def summaries(self, chosen: ConversationFilter) -> list[ConversationSummary]:
        """`list_conversations`: reads only the summaries it returns (plus those tied with the last one,
        and any marker it finds stale)."""
        checked_limit, newest_first = chosen.limit, chosen.newest_first
        scope = _scope(chosen.agent_name)
        found: list[ConversationSummary] = []
        for attempt in range(_ATTEMPTS):
            markers = sorted(self._listed(scope), reverse=newest_first)
            found, stale = self._collect(markers, scope, checked_limit)
            if not stale or attempt + 1 == _ATTEMPTS:
                break
            for key in stale:
                self._repair(key, scope)
        found.sort(key=lambda summary: (summary.last_started_at, summary.conversation_id), reverse=newest_first)
        return found[:checked_limit]

    def _repair(self, key: str, scope: str) -> None:
        """Put the marker of conversation `key` right (it was found above its newest run, or twice)."""
        paths = ConversationPaths(self.root / CONVERSATIONS_DIRECTORY_NAME / key)
        try:
            with self._locked(paths):
                self._settle(paths, scope, search=True)
        except FileNotFoundError:  # no such conversation (any more): only its markers are left
            markers = self._markers(scope)
            for name in self.io.list_directory(markers):
                if name.endswith(f'.{key}'):
                    (markers / name).unlink(missing_ok=True)

    def _listed(self, scope: str) -> Iterator[tuple[int, str]]:
        for name in self.io.list_directory(self._markers(scope)):
            start, _, key = name.partition('.')
            if len(start) == 19 and start.isdigit() and len(key) == 64:
                yield int(start), key

    def _collect(
        self, markers: Iterable[tuple[int, str]], scope: str, limit: int | None
    ) -> tuple[list[ConversationSummary], list[str]]:
        """The summaries of `markers` in their order, up to `limit` (and its ties); and the keys of
        conversations whose marker is stale."""
        found: list[ConversationSummary] = []
        stale: list[str] = []
        seen: set[str] = set()
        boundary: int | None = None
        for start, key in markers:
            if limit is not None and len(found) >= limit and start != boundary:
                break
            if key in seen:
                stale.append(key)
                continue
            seen.add(key)
            summary = read_or_skip(f'conversation {key}', partial(self._summary, key, scope))
            if summary is None or start_of(summary.last_started_at) != start:
                stale.append(key)
                continue
            found.append(summary)
            boundary = start
        return found, stale

    def _summary(self, key: str, scope: str) -> ConversationSummary | None:
        paths = ConversationPaths(self.root / CONVERSATIONS_DIRECTORY_NAME / key)
        directory = paths.entries(scope)
        entries = list(self.links.valid(directory))
        if not entries:
            return None
        return ConversationSummary(
            conversation_id=load_conversation_file(self.io.read_all(paths.id_file)),
            first_started_at=started_at_of(entries[0].start),
            last_started_at=started_at_of(entries[-1].start),
            run_count=len(entries),
            head_run_id=entries[-1].run_id,
        )

    # --- directories written before the index ---

    def is_indexed(self) -> bool:
        """Whether the index covers every run (`False` for a store directory written before the index, until
        its first write indexes it: reads there look at every run instead, and write nothing)."""
        return self.marker.is_set()

    def ensure_indexed(self, every_run: Callable[[], Iterable[tuple[RunRecord, int]]]) -> None:
        """Before a write: index every run of a store directory written before the conversation index (once)."""
        self.marker.ensure(every_run, self._index_stored)

    def _index_stored(self, record: RunRecord, registered_ns: int) -> None:
        if record.conversation_id is None:
            return
        paths = self._paths(record.conversation_id)
        entry = Entry(start_of(record.started_at), registered_ns, record.run_id)
        with self._locked(paths, record.conversation_id):
            for scope in _scopes(record):
                self._raise(paths, scope, entry.start)
                if not self.links.link_stored(paths.entries(scope), entry):
                    self._settle(paths, scope)  # deleted or registered again meanwhile
