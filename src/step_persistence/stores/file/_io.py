"""Blocking file primitives of the file store: counted reads, whole-line appends, atomic writes, fsync.

Every byte the store reads or writes goes through `FileIo`, which counts it (`IoCounters`), so the
cost of an operation can be measured in bytes rather than guessed from timings.

Nothing below the store's directory is reached through a symbolic link: files are opened with
`O_NOFOLLOW` and the directories the store writes into are checked with `lstat`
(`real_directory`), so a link planted for a journal, a run's directory, `snapshots/`, `@media` or
`@tmp` is refused with `UnsafePath` instead of making writes land (or reads come from) outside the
store. The store's directory itself may be a link: that is the caller's choice.

**Grouped syncs.** Inside `grouped_syncs()`, a thread's writes are not flushed one by one: each
file written and each directory synced is kept open until the next `barrier()` (or the group's
end), which flushes them all at once, in parallel threads, and returns when every one is on the
disk. A file system commits flushes that wait at the same time together, so a group of writes
costs about one flush's latency instead of one per file. A barrier is where order matters across
a power loss (a snapshot's rows and file before the `snapshots.jsonl` line committing it, a staged
directory's files before its rename); between two barriers, a power loss may keep any subset of
the writes (a crash of the process keeps them in the order they were made, as without groups).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
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
    files_synced: int = 0
    """`fsync`s of a file or directory (none with `fsync=False`)."""
    flushes: int = 0
    """Waits for the disk: one per `fsync` made alone, one per group of them made together (see the module)."""


SYNC_THREADS = 8
"""Threads a store flushes a group's files with (more files than that queue for a free thread)."""


class _SyncThreads:
    """A store's flushing threads: made on first use (again in a forked child, which has none of them),
    let go by `close`."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._guard = threading.Lock()

    def submit(self, fd: int) -> Future[None]:
        """`fsync(fd)` in one of the threads."""
        with self._guard:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix='file-store-fsync')
                self._pid = os.getpid()
            return self._pool.submit(os.fsync, fd)

    def close(self) -> None:
        """Let the threads end once they are done (without waiting for them); the next flush makes new ones."""
        with self._guard:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.shutdown(wait=False)
            self._pool = None


@dataclass
class _SyncGroup:
    """The descriptors a thread's group has written (or, for directories, opened) and not flushed yet."""

    files: list[int] = field(default_factory=list[int])
    directories: dict[str, int] = field(default_factory=dict[str, int])

    def take(self) -> list[int]:
        """Every pending descriptor, the group left empty."""
        pending = [*self.files, *self.directories.values()]
        self.files.clear()
        self.directories.clear()
        return pending


class FileIo:
    """Blocking I/O with byte counting and optional `fsync`; call it from worker threads only."""

    def __init__(self, *, fsync: bool) -> None:
        self.fsync = fsync
        self.counters = IoCounters()
        self._counting = threading.Lock()
        self._groups = threading.local()
        self._threads = _SyncThreads()

    def _count(self, *, read: int = 0, written: int = 0, files: int = 0, directories: int = 0, synced: int = 0) -> None:
        with self._counting:
            self.counters.bytes_read += read
            self.counters.bytes_written += written
            self.counters.files_read += files
            self.counters.directories_listed += directories
            self.counters.files_synced += synced
            self.counters.flushes += 1 if synced else 0

    def sync_now(self, fd: int) -> None:
        """`fsync` an open file at once, in a group too (when fsync is on; the caller keeps `fd` open)."""
        if self.fsync:
            os.fsync(fd)
            self._count(synced=1)

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

    def write_uncommitted(self, path: Path, data: bytes) -> None:
        """Create `path` holding `data` without a temporary file, its directory entry synced too.

        Only for a file no reader opens until a later write commits it (a snapshot's file before its
        `snapshots.jsonl` line): what a crash leaves half-written there is never read, and is
        removed (never written through: it may be a link) by the next save of that name.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = open_unlinked(path, flags)
        except FileExistsError:
            path.unlink()
            fd = open_unlinked(path, flags)
        self._write_and_close(fd, data)
        self.sync_directory(path.parent)

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Replace `path` by a file holding `data`: readers see the old file or the new one, never a mix.

        In a group, the new file is flushed before it replaces the old one (a barrier), so a power
        loss leaves one of the two whole."""
        temporary = _temporary(path)
        try:
            self.create(temporary, data)
            self.barrier()
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
        """Make the entries of directory `path` durable (when fsync is on; in a group, at its next barrier)."""
        if not self.fsync:
            return
        group = self._group()
        if group is not None and os.fspath(path) in group.directories:
            return  # flushed at the barrier, with every entry made until then
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        if group is not None:
            group.directories[os.fspath(path)] = fd
            return
        try:
            self.sync_now(fd)
        finally:
            os.close(fd)

    @contextmanager
    def grouped_syncs(self) -> Iterator[None]:
        """Defer this thread's flushes within the block to `barrier()` and to the block's end (see the module).

        Nested groups are one group. If the block raises, what it wrote is still flushed (a flush
        that fails then is not reported over the block's error).
        """
        if not self.fsync or self._group() is not None:
            yield
            return
        group = _SyncGroup()
        self._groups.group = group
        try:
            yield
        except BaseException:
            with suppress(OSError):
                self._flush(group)
            raise
        else:
            self._flush(group)
        finally:
            self._groups.group = None
            for fd in group.take():
                os.close(fd)

    def close(self) -> None:
        """Let the threads that flush groups end (they are made again when needed)."""
        self._threads.close()

    def barrier(self) -> None:
        """In a group: flush everything the group wrote so far before going on (elsewhere: nothing to do)."""
        group = self._group()
        if group is not None:
            self._flush(group)

    def _group(self) -> _SyncGroup | None:
        group: _SyncGroup | None = getattr(self._groups, 'group', None)
        return group

    def _flush(self, group: _SyncGroup) -> None:
        """`fsync` every pending descriptor of `group` (in parallel when there are several), then close them."""
        pending = group.take()
        try:
            others = [self._threads.submit(fd) for fd in pending[1:]]
            try:
                if pending:
                    os.fsync(pending[0])
            finally:
                wait(others)  # every descriptor stays open until no thread uses it
            for done in others:
                done.result()
            self._count(synced=len(pending))
        finally:
            for fd in pending:
                os.close(fd)

    def _write_and_close(self, fd: int, data: bytes, *, sync: bool = True) -> None:
        """Write all of `data` to `fd` (then `fsync` it, when fsync is on and `sync`; in a group, at its next
        barrier) and close it."""
        group = self._group() if self.fsync and sync else None
        try:
            self._write_all(fd, data)
            if group is not None:
                group.files.append(fd)
                return
            if sync:
                self.sync_now(fd)
        except BaseException:
            os.close(fd)
            raise
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
