"""The store-wide run index: `list_runs` without a conversation, without reading every run.

Every run has an entry in `@runs/all/` and, when its record names them, in `@runs/agents/<key>/`
(its agent), `@runs/parents/<key>/` (the run it was delegated from) and `@runs/origins/<key>/` (the
run whose snapshot it continued or forked): a hard link to its `run.json`, made, checked and read
as `_entries.py` says. A listing lists the one directory that serves its most selective filter and
reads only the `run.json` files it returns (and those the other filters pass over). Entries are
made and removed without a lock: each names one registration (its stamp), and only the writer
holding the run's lock registers, fills or deletes it.

**A bare run's filling** links the filled `run.json` (staged) before it replaces the bare one, and
removes the bare run's entry after. When both records have the same `started_at`, the two entries
have the same name: the filling replaces the entry before the rename, so for that instant a listing
misses the run (it is being registered); a filling that fails puts the bare run's entry back.

**Older directories** (written before this index, `@runs/complete` absent) are listed by reading
every run; the first write indexes every run. To re-index a store whose runs were copied in from
elsewhere (run directories without entries), remove `@runs/complete`: the next write indexes every
run again (entries already there stay).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from step_persistence.records import RunRecord
from step_persistence.stores._listing import RunFilter
from step_persistence.stores.file._entries import EntryLinks, IndexMarker
from step_persistence.stores.file._io import FileIo
from step_persistence.stores.file._layout import RUNS_DIRECTORY_NAME, Entry, RunIndexPaths, start_of

__all__ = ['AllRunsIndex']


def _entry(record: RunRecord, registered_ns: int) -> Entry:
    return Entry(start_of(record.started_at), registered_ns, record.run_id)


class AllRunsIndex:
    """The store-wide run index of the store directory `root`."""

    def __init__(self, root: Path, io: FileIo) -> None:
        self.root = root
        self.paths = RunIndexPaths(root / RUNS_DIRECTORY_NAME)
        self.links = EntryLinks(root, io)
        self.marker = IndexMarker(root, self.paths.complete_marker, io)

    def _directories(self, record: RunRecord) -> list[Path]:
        """The entry directories `record` is listed in."""
        paths = self.paths
        found = [paths.every_run]
        if record.agent_name is not None:
            found.append(paths.of_agent(record.agent_name))
        if record.parent_run_id is not None:
            found.append(paths.of_parent(record.parent_run_id))
        if record.origin is not None:
            found.append(paths.of_origin(record.origin.run_id))
        return found

    # --- writing, under the run's lock (or before its directory exists) ---

    @contextmanager
    def registering(
        self, record: RunRecord, registered_ns: int, run_file: Path, *, replacing: RunRecord | None = None
    ) -> Iterator[None]:
        """Index `record` (registered as `registered_ns`, its `run.json` staged at `run_file`) around the
        block that puts that `run.json` in place; if the block raises, the entries are taken back.

        `replacing`: the bare run's record the block replaces (same stamp), whose entries go after it.
        """
        entry = _entry(record, registered_ns)
        made = [(directory, entry.name) for directory in self._directories(record)]
        bare = [] if replacing is None else self._directories(replacing)
        bare_entry = entry if replacing is None else _entry(replacing, registered_ns)
        linked: list[Path] = []
        try:
            for directory, _ in made:
                self.links.link(directory, entry, run_file, replace=True)
                linked.append(directory)
            yield
        except BaseException:
            for directory in linked:
                self.links.take_back(directory, entry)
            for directory in bare:
                if (directory, bare_entry.name) in made:  # replaced above: put back
                    self.links.link_stored(directory, bare_entry)
            raise
        for directory in bare:
            if (directory, bare_entry.name) not in made:
                self.links.unlink(directory, bare_entry)

    def remove(self, record: RunRecord, registered_ns: int) -> None:
        """Take a deleted run (its directory gone already) out of the index."""
        entry = _entry(record, registered_ns)
        for directory in self._directories(record):
            if directory.exists():
                self.links.unlink(directory, entry)

    # --- reading ---

    def directory_for(self, chosen: RunFilter) -> Path:
        """The entry directory listing the runs `chosen` can match, of its most selective filter: its
        parent's, origin's or agent's runs, else every run (the caller still tests `chosen.matches`)."""
        if chosen.parent_run_id is not None:
            return self.paths.of_parent(chosen.parent_run_id)
        if chosen.origin_run_id is not None:
            return self.paths.of_origin(chosen.origin_run_id)
        if chosen.agent_name is not None:
            return self.paths.of_agent(chosen.agent_name)
        return self.paths.every_run

    def entries(self, directory: Path, *, newest_first: bool) -> Iterator[Entry]:
        """The entries in `directory` (of `directory_for`), in `list_runs` order (or its reverse).

        Not checked: `record` says whether an entry is still its run.
        """
        return self.links.listed(directory, newest_first=newest_first)

    def record(self, directory: Path, entry: Entry) -> RunRecord | None:
        """The record of the run an entry of `entries(directory, ...)` stands for (`EntryLinks.record`)."""
        return self.links.record(directory, entry)

    # --- directories written before the index ---

    def is_indexed(self) -> bool:
        """Whether the index covers every run (`False` for a store directory written before it, until its
        first write indexes it: reads there look at every run instead, and write nothing)."""
        return self.marker.is_set()

    def ensure_indexed(self, every_run: Callable[[], Iterable[tuple[RunRecord, int]]]) -> None:
        """Before a write: index every run of a store directory written before the run index (once)."""
        self.marker.ensure(every_run, self._index_stored)

    def _index_stored(self, record: RunRecord, registered_ns: int) -> None:
        entry = _entry(record, registered_ns)
        for directory in self._directories(record):
            self.links.link_stored(directory, entry)
