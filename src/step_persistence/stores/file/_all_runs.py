"""The store-wide run index: `list_runs` without a conversation, without reading every run.

Every run has an entry in `@runs/all/` and, with an `agent_name`, in `@runs/agents/<agent key>/`:
a hard link to its `run.json`, made, checked and read as `_entries.py` says, so listing the newest
(or oldest) runs lists one directory and reads only the `run.json` files returned. Entries are
made and removed without a lock: each names one registration (its stamp), and only the writer
holding the run's lock registers, fills or deletes it.

**A bare run's filling** links the filled `run.json` (staged) before it replaces the bare one, and
removes the bare run's entry after. When both records have the same `started_at`, the two entries
have the same name: the filling replaces the entry before the rename, so for that instant a listing
misses the run (it is being registered); a filling that fails puts the bare run's entry back.

**Older directories** (written before this index, `@runs/indexed` absent) are listed by reading
every run; the first write indexes every run. To re-index a store whose runs were copied in from
elsewhere (run directories without entries), remove `@runs/indexed`: the next write indexes every
run again (entries already there stay).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from step_persistence.records import RunRecord
from step_persistence.stores.file._entries import EntryLinks, IndexMarker, scope_of, scopes_of
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
        self.marker = IndexMarker(root, self.paths.indexed_marker, io)

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
        made = [(self.paths.entries(scope), entry.name) for scope in scopes_of(record)]
        bare = [] if replacing is None else [self.paths.entries(scope) for scope in scopes_of(replacing)]
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
        for scope in scopes_of(record):
            directory = self.paths.entries(scope)
            if directory.exists():
                self.links.unlink(directory, entry)

    # --- reading ---

    def entries(self, agent_name: str | None, *, newest_first: bool) -> Iterator[Entry]:
        """The entries of every run (of `agent_name`'s, when given), in `list_runs` order (or its reverse).

        Not checked: `record` says whether an entry is still its run.
        """
        return self.links.listed(self.paths.entries(scope_of(agent_name)), newest_first=newest_first)

    def record(self, agent_name: str | None, entry: Entry) -> RunRecord | None:
        """The record of the run an entry of `entries(agent_name, ...)` stands for (`EntryLinks.record`)."""
        return self.links.record(self.paths.entries(scope_of(agent_name)), entry)

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
        for scope in scopes_of(record):
            self.links.link_stored(self.paths.entries(scope), entry)
