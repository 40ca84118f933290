"""At most one run stored as the `continued` run of each snapshot, across threads and processes.

Each snapshot some run registered to continue has a marker `@origins/<key>` (`key`: the SHA-256 of
the origin's run id and seq, never the raw id) naming the run that continues it and that run's
incarnation token. A registration takes the marker's lock (`flock`, exclusive) and keeps it until
its run directory is in place (or, filling in a bare run, its `run.json`): if the marker names a run
that is stored with that token and that origin in its record, the new run is a fork; otherwise (no
marker, an empty one, or one naming a run that was deleted, never got registered or filled in
because its registrant crashed) the marker is written to name the new run. Deleting the continuing
run removes the marker, which frees the snapshot for another continuation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from step_persistence.records import RunOrigin
from step_persistence.stores.file._io import FileIo, UnsafePath, open_unlinked, real_directory
from step_persistence.stores.file._layout import ORIGINS_DIRECTORY_NAME, is_run_directory_name, run_paths, text_key
from step_persistence.stores.file._locking import TOKEN_LENGTH, locked_file
from step_persistence.stores.file._run_files import read_record

__all__ = ['OriginClaims']

_MARKER_BYTES = 512
"""More than a marker holds (a run id of at most 200 characters, a newline, a token)."""


class OriginClaims:
    """The `@origins/` markers of a store's directory."""

    def __init__(self, root: Path, io: FileIo) -> None:
        self.root = root
        self.io = io

    def _marker(self, origin: RunOrigin) -> Path:
        key = text_key(json.dumps([origin.run_id, origin.seq]))
        return self.root / ORIGINS_DIRECTORY_NAME / key

    @contextmanager
    def claiming(self, origin: RunOrigin | None, run_id: str, incarnation: str) -> Iterator[RunOrigin | None]:
        """The origin run `run_id` is registered with: `origin`, or a fork of its snapshot when another
        stored run continues it already. The claim holds until the block ends; if the block raises
        (the registration failed), the marker is put back as it was."""
        if origin is None or origin.kind != 'continued':
            yield origin
            return
        marker = self._marker(origin)
        marker.parent.mkdir(parents=True, exist_ok=True)
        with locked_file(
            marker,
            exclusive=True,
            flags=os.O_RDWR | os.O_CREAT,
            missing=lambda: FileNotFoundError(f'{marker} vanished'),  # O_CREAT: never raised
        ) as fd:
            previous = self.io.read_fd(fd, _MARKER_BYTES)
            if self._continues(previous, origin):
                yield origin.model_copy(update={'kind': 'forked'})
                return
            self._write(fd, f'{run_id}\n{incarnation}'.encode('ascii'))
            self.io.sync_directory(marker.parent)
            try:
                yield origin
            except BaseException:
                self._write(fd, previous)
                raise

    def release(self, origin: RunOrigin | None, run_id: str, incarnation: str) -> None:
        """After run `run_id` (registration `incarnation`) was deleted: free the snapshot it continued."""
        if origin is None or origin.kind != 'continued':
            return
        marker = self._marker(origin)
        try:
            with locked_file(marker, exclusive=True, missing=lambda: FileNotFoundError(f'{marker} is not there')) as fd:
                if self.io.read_fd(fd, _MARKER_BYTES) == f'{run_id}\n{incarnation}'.encode('ascii'):
                    marker.unlink()
                    self.io.sync_directory(marker.parent)
        except FileNotFoundError:
            return

    def _continues(self, content: bytes, origin: RunOrigin) -> bool:
        """Whether the marker's `content` names a run that is stored, in the registration it names, with
        `origin` in its record (a filling that crashed left the marker, not the record)."""
        run_id, _, incarnation = content.decode('ascii', errors='replace').partition('\n')
        if not is_run_directory_name(run_id) or len(incarnation) != TOKEN_LENGTH:
            return False
        paths = run_paths(self.root, run_id)
        try:
            real_directory(paths.directory)
            fd = open_unlinked(paths.lock_file, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, UnsafePath):
            return False
        try:
            if self.io.read_fd(fd, TOKEN_LENGTH).decode('ascii', errors='replace') != incarnation:
                return False
        finally:
            os.close(fd)
        try:
            return read_record(self.io, paths)[0].origin == origin
        except (OSError, ValueError):
            return True  # a record that cannot be read: the marker is trusted, as before records were checked

    def _write(self, fd: int, content: bytes) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, content, 0)
        self.io.sync_now(fd)
