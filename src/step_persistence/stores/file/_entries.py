"""Index entries: runs listed by one directory's names, each a hard link to its `run.json`.

The mechanism of both indexes of the file store: the conversation index (`_conversations.py`) and
the store-wide run index (`_all_runs.py`).

**Entries.** A run's entry is named `<start>.<registration>.<run_id>` (`Entry.name`) with fixed-width
numbers, so sorted names are `list_runs` order. It is a hard link to the run's `run.json`: it counts
only while it is the very file `<run_id>/run.json` names (two `lstat`s, no read), so an entry left by
a registration, a bare run's filling or a deletion that crashed halfway, or by an earlier
registration of the same run id, never counts. (An entry that is a file of its own, as in a copy of
the store made without its hard links, or left by a crash, is compared with the run's `run.json` by
the registration stamp and their bytes, read.) An entry is made before the `run.json` it links
appears (the registration's or the filling's, staged), replacing one of the same name a crashed
filling left, and removed after its run is gone. So in an indexed store every run has its entries;
a run directory without one came from elsewhere (copied in by hand, or written by a version of the
library without the index).

An index has one entry directory per list it serves (every run, an agent's runs...); a run has an
entry in each list it belongs to.

**Older directories.** A store directory written before an index has none of its entries: its first
write indexes every run once and then leaves the index's marker (`IndexMarker`); until then reads
look at every run instead (reading never writes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from pathlib import Path

from step_persistence.records import RunRecord
from step_persistence.stores.file._io import FileIo, real_directory
from step_persistence.stores.file._layout import Entry, run_paths
from step_persistence.stores.file._run_files import load_run_file, read_stamp
from step_persistence.stores.file._sessions import foreign_run_message

__all__ = ['EntryLinks', 'IndexMarker']


class EntryLinks:
    """Making, checking and reading the entries of runs stored under `root`, in any entry directory."""

    def __init__(self, root: Path, io: FileIo) -> None:
        self.root = root
        self.io = io

    # --- writing ---

    def link(self, directory: Path, entry: Entry, run_file: Path, *, replace: bool = False) -> Path:
        """Link the entry in `directory` to `run_file` (created with its parents); an entry of that name already
        there stays, unless `replace`. `FileNotFoundError` if `run_file` is gone."""
        directory.mkdir(parents=True, exist_ok=True)
        real_directory(directory)
        path = directory / entry.name
        if replace:
            path.unlink(missing_ok=True)
        with suppress(FileExistsError):
            os.link(run_file, path)
        self.io.sync_directory(directory)
        return path

    def link_stored(self, directory: Path, entry: Entry) -> bool:
        """Index a run stored before the index, whose record and stamp were read as `entry` (replacing an
        entry of that name that does not count); `False` (and no entry) if the run was deleted, or
        registered again, since."""
        paths = run_paths(self.root, entry.run_id)
        try:
            path = self.link(directory, entry, paths.run_file, replace=not self.is_valid(directory, entry))
        except FileNotFoundError:
            return False
        try:
            current = read_stamp(self.io, paths)
        except (OSError, ValueError):
            current = None
        if current == entry.registered_ns:
            return True
        path.unlink(missing_ok=True)  # the link may have caught a later registration's run.json
        self.io.sync_directory(directory)
        return False

    def take_back(self, directory: Path, entry: Entry) -> None:
        """Remove an entry a failed registration made, unless it counts (the failure came after its `run.json`
        appeared: the run is there, with this entry)."""
        if not self.is_valid(directory, entry):
            (directory / entry.name).unlink(missing_ok=True)

    def unlink(self, directory: Path, entry: Entry) -> None:
        """Remove the entry (after its run is gone)."""
        (directory / entry.name).unlink(missing_ok=True)
        self.io.sync_directory(directory)

    # --- reading ---

    def listed(self, directory: Path, *, newest_first: bool = False) -> Iterator[Entry]:
        """The entries in `directory` in `list_runs` order (or its reverse), parsed as they are consumed;
        not checked (see `is_valid`, `record`)."""
        names = sorted(self.io.list_directory(directory), reverse=newest_first)
        return (entry for entry in map(Entry.parse, names) if entry is not None)

    def valid(self, directory: Path, *, newest_first: bool = False) -> Iterator[Entry]:
        """The entries in `directory` that stand for their run's current registration, in order (`listed`)."""
        return (entry for entry in self.listed(directory, newest_first=newest_first) if self.is_valid(directory, entry))

    def is_valid(self, directory: Path, entry: Entry) -> bool:
        """Whether the entry stands for the run's current registration: it is that `run.json` (or, an entry
        linked nowhere else, as in a copy of the store made without its hard links, has its bytes and the
        run has the entry's stamp)."""
        paths = run_paths(self.root, entry.run_id)
        try:
            linked = os.lstat(directory / entry.name)
            current = os.lstat(paths.run_file)
        except (FileNotFoundError, NotADirectoryError):
            return False
        if os.path.samestat(linked, current):
            return True
        if linked.st_nlink != 1:
            return False  # a link to another file than the run's `run.json`
        try:
            same = self.io.read_all(directory / entry.name) == self.io.read_all(paths.run_file)
            return same and read_stamp(self.io, paths) == entry.registered_ns
        except (OSError, ValueError):
            return False

    def record(self, directory: Path, entry: Entry) -> RunRecord | None:
        """The record of the run the entry stands for, read through the entry itself (the very `run.json`
        of that registration, so record and registration always agree); `None` when the entry is not the
        run's current registration.

        `ValueError` if the file is unreadable or names another run, `UnsafePath` if the run's
        directory is a symbolic link.
        """
        paths = run_paths(self.root, entry.run_id)
        try:
            real_directory(paths.directory)
            record, _ = load_run_file(self.io.read_all(directory / entry.name))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if record.run_id != entry.run_id:
            raise ValueError(foreign_run_message(paths, record.run_id))
        return record if self.is_valid(directory, entry) else None


class IndexMarker:
    """The file (`path`, under the store directory `root`) saying an index covers every run of the store."""

    def __init__(self, root: Path, path: Path, io: FileIo) -> None:
        self.root = root
        self.path = path
        self.io = io
        self._set = False

    def is_set(self) -> bool:
        """Whether the index covers every run (`False` for a store directory written before the index, until
        its first write indexes it)."""
        if not self._set:
            self._set = self.path.exists()
        return self._set

    def ensure(
        self, every_run: Callable[[], Iterable[tuple[RunRecord, int]]], index: Callable[[RunRecord, int], None]
    ) -> None:
        """Before a write: `index(record, registered_ns)` every run of a store directory written before the
        index, then set the marker (once)."""
        if self.is_set() or not self.root.exists():
            return  # nothing to index yet; a registration creates the directory
        for record, registered_ns in every_run():
            index(record, registered_ns)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with suppress(FileExistsError):
            self.io.create(self.path, b'')
        self._set = True
