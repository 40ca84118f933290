"""Blocking file primitives of the file store: counted reads, whole-line appends, atomic writes, fsync.

Every byte the store reads or writes goes through `FileIo`, which counts it (`IoCounters`), so the
cost of an operation can be measured in bytes rather than guessed from timings.

Nothing below the store's directory is reached through a symbolic link: files are opened with
`O_NOFOLLOW` and the directories the store writes into are checked with `lstat`
(`real_directory`), so a link planted for a journal, a run's directory, `snapshots/`, `@media` or
`@tmp` is refused with `UnsafePath` instead of making writes land (or reads come from) outside the
store. The store's directory itself may be a link: that is the caller's choice.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ['FileIo', 'IoCounters', 'Span', 'UnsafePath', 'open_unlinked', 'real_directory']


class UnsafePath(ValueError):
    """A path of the store is a symbolic link (or not the directory it should be): it is never followed."""


def open_unlinked(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """`os.open` that refuses a symbolic link as the last component of `path` (`UnsafePath`)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as error:
        # Linux and macOS say ELOOP for a link opened with O_NOFOLLOW, FreeBSD EMLINK.
        if error.errno in (errno.ELOOP, errno.EMLINK):
            raise UnsafePath(f'{path} is a symbolic link; the file store never follows links') from None
        raise


def real_directory(path: str | Path) -> None:
    """Raise `UnsafePath` unless `path` is a directory and not a symbolic link; `FileNotFoundError` if absent."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise UnsafePath(f'{path} is a symbolic link; the file store never follows links')
    if not stat.S_ISDIR(mode):
        raise UnsafePath(f'{path} is not a directory')


Span = tuple[int, int]
"""`(offset, length)` of a line in a file, without its newline."""


@dataclass
class IoCounters:
    """Bytes the store has read and written since it was created (diagnostics, tests, benchmarks)."""

    bytes_read: int = 0
    bytes_written: int = 0
    files_read: int = 0
    """Reads of a file (each opens it once, whatever the number of bytes)."""
    directories_listed: int = 0


class FileIo:
    """Blocking I/O with byte counting and optional `fsync`; call it from worker threads only."""

    def __init__(self, *, fsync: bool) -> None:
        self.fsync = fsync
        self.counters = IoCounters()
        self._counting = threading.Lock()

    def _count(self, *, read: int = 0, written: int = 0, files: int = 0, directories: int = 0) -> None:
        with self._counting:
            self.counters.bytes_read += read
            self.counters.bytes_written += written
            self.counters.files_read += files
            self.counters.directories_listed += directories

    def read_all(self, path: str | Path) -> bytes:
        """The whole content of `path`."""
        return self.read_from(path, 0)[1]

    def read_from(self, path: str | Path, offset: int) -> tuple[int, bytes]:
        """`(size of the file, its bytes from offset to the end)`; nothing is read when offset >= size."""
        fd = open_unlinked(path, os.O_RDONLY)
        self._count(files=1)
        try:
            size = os.fstat(fd).st_size
            data = self._pread(fd, size - offset, offset) if size > offset else b''
        finally:
            os.close(fd)
        return size, data

    def read_fd(self, fd: int, length: int) -> bytes:
        """Up to `length` bytes from the start of an open file."""
        self._count(files=1)
        return self._pread(fd, length, 0)

    def read_spans(self, path: Path, spans: Sequence[Span]) -> list[bytes]:
        """The bytes of each span of `path`, reading each stretch of adjacent lines in one call."""
        stretches: list[list[Span]] = []
        for span in sorted(set(spans)):
            if stretches and span[0] <= _end(stretches[-1][-1]) + 1:
                stretches[-1].append(span)
            else:
                stretches.append([span])
        found: dict[Span, bytes] = {}
        if not stretches:
            return []
        fd = open_unlinked(path, os.O_RDONLY)
        self._count(files=1)
        try:
            for stretch in stretches:
                first = stretch[0][0]
                chunk = self._pread(fd, _end(stretch[-1]) - first, first)
                for span in stretch:
                    found[span] = chunk[span[0] - first : _end(span) - first]
        finally:
            os.close(fd)
        return [found[span] for span in spans]

    def _pread(self, fd: int, length: int, offset: int) -> bytes:
        parts: list[bytes] = []
        remaining = length
        while remaining > 0:
            part = os.pread(fd, remaining, offset + length - remaining)
            if not part:
                break
            parts.append(part)
            remaining -= len(part)
        data = b''.join(parts)
        self._count(read=len(data))
        return data

    def list_directory(self, path: Path) -> list[str]:
        """The names in directory `path` (`[]` if it does not exist); `UnsafePath` if it is a symbolic link."""
        try:
            real_directory(path)
            names = os.listdir(path)
        except FileNotFoundError:
            return []
        self._count(directories=1)
        return names

    def append(self, path: Path, data: bytes) -> None:
        """Append `data` to an existing file with one `O_APPEND` write (looping only on a short write)."""
        self._write_and_close(open_unlinked(path, os.O_WRONLY | os.O_APPEND), data)

    def create(self, path: Path, data: bytes) -> None:
        """Create a new file holding `data`; `FileExistsError` if it exists."""
        self._write_and_close(open_unlinked(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), data)

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Replace `path` by a file holding `data`: readers see the old file or the new one, never a mix."""
        temporary = _temporary(path)
        try:
            self.create(temporary, data)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self.sync_directory(path.parent)

    def write_hint(self, path: Path, data: bytes) -> None:
        """`write_atomic`, but never flushed to the disk: for a hint whose loss costs a repair, not data."""
        temporary = _temporary(path)
        try:
            self._write_and_close(open_unlinked(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL), data, sync=False)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def sync_directory(self, path: Path) -> None:
        """Make the entries of directory `path` durable (when fsync is on)."""
        if not self.fsync:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_and_close(self, fd: int, data: bytes, *, sync: bool = True) -> None:
        """Write all of `data` to `fd` (then `fsync` it, when fsync is on and `sync`) and close it."""
        try:
            self._write_all(fd, data)
            if self.fsync and sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        self._count(written=len(data))


def _temporary(path: Path) -> Path:
    return path.with_name(f'.{path.name}.{secrets.token_hex(8)}.tmp')


def _end(span: Span) -> int:
    return span[0] + span[1]
