"""`DiskMediaStore`: one file per blob under a directory, metadata in a sidecar JSON file."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import tempfile
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import anyio.to_thread

from step_persistence._closing import ClosesOnExit
from step_persistence._lru import BoundedLru
from step_persistence.media.clock import media_now
from step_persistence.media.keys import blob_key, default_key_strategy, resolve_public_url, uri_of_key
from step_persistence.media.protocol import NO_CONTEXT, KeyStrategy, MediaContext, PublicUrlResolver, StoredBlob
from step_persistence.media.uri import check_digest, media_uri_for

__all__ = ['DiskMediaStore']

_SIDECAR_SUFFIX = '.meta.json'
_SIDECAR_VERSION = 1


def _write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb') as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _modified(path: Path) -> datetime:
    """The file's modification time as an aware UTC datetime (exact to the microsecond)."""
    return _EPOCH + timedelta(microseconds=path.stat().st_mtime_ns // 1000)


def _touch(path: Path) -> bool:
    """Set the file's modification time to `media_now()`; whether it exists as a regular file.

    A symbolic link is never followed (its target is outside the store's control): it reads as absent.
    """
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        stamp = int(media_now().timestamp() * 1_000_000) * 1000
        os.utime(path, ns=(stamp, stamp), follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


_Fingerprint = tuple[int, int, int, int, int]
"""`(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)` of a blob file: any write to it changes it."""

_CHECKED_LIMIT = 100_000
"""How many blob files one store remembers having written or checked (the least recently used are forgotten)."""


def _fingerprint(status: os.stat_result) -> _Fingerprint:
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def _holds(path: Path, data: bytes) -> bool:
    """Whether the regular file at `path` (not followed if a link) holds exactly `data`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, OSError):
        return False
    with os.fdopen(fd, 'rb') as file:
        return file.read(len(data) + 1) == data


class DiskMediaStore(ClosesOnExit):
    """Blobs as files: `<directory>/<key>` (default key `<sha256>.bin`), metadata in `<key>.meta.json`.

    Writes are atomic (temporary file, then rename), sidecar first and blob last, so a blob that
    exists always has its metadata. Blocking file I/O runs in a worker thread. A key strategy
    that yields an absolute path or a `..` segment is rejected with `ValueError`. A blob's touched
    time (see `CollectableMediaStore`) is its file's modification time: `put` of stored bytes and
    `touch` set it to now.

    `put` of bytes already stored checks the stored file first and writes it again when it no
    longer holds them (a flipped byte, a truncation, a link in its place), so a save never comes
    to rely on a damaged copy. The check is a `stat` when this store object wrote or checked the
    file since it last changed (its inode, size, modification and change times), and a read of
    the file otherwise. The media walker therefore calls `put` at every reuse of a blob
    (`put_checks_stored_copy`), and does not remember blobs of this store (`remember_reuse`).
    """

    put_checks_stored_copy: ClassVar[bool] = True
    """`put` of stored bytes checks the stored copy and rewrites it if it differs (read by the media walker)."""
    remember_reuse: ClassVar[bool] = False
    """The walker need not remember blobs it stored here: checking one again is a local `stat`."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        key_strategy: KeyStrategy = default_key_strategy,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        self.directory = Path(directory)
        self._key_strategy = key_strategy
        self._public_url = public_url
        self._checked: BoundedLru[str, _Fingerprint] = BoundedLru(_CHECKED_LIMIT)
        """Per blob file, its fingerprint when this store last wrote it, checked it or touched it."""

    def path_for(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Path:
        """The file that holds (or would hold) the blob at `uri`."""
        key = blob_key(self._key_strategy, uri, context)
        if key.endswith(_SIDECAR_SUFFIX):
            raise ValueError(f'key strategy returned {key!r}; keys ending in {_SIDECAR_SUFFIX!r} are reserved')
        return self.directory.joinpath(*key.split('/'))

    @staticmethod
    def _sidecar(path: Path) -> Path:
        return path.with_name(path.name + _SIDECAR_SUFFIX)

    async def put(self, data: bytes, *, context: MediaContext = NO_CONTEXT) -> str:
        uri = media_uri_for(data)
        path = self.path_for(uri, context=context)
        sidecar = {
            'v': _SIDECAR_VERSION,
            'uri': uri,
            'media_type': context.media_type,
            'filename': context.filename,
            'metadata': dict(context.metadata),
        }

        def write() -> None:
            if self._reuse(path, data):
                return
            if not (os.path.lexists(path) and self._sidecar(path).is_file()):  # a repair keeps the first metadata
                _write_atomically(self._sidecar(path), json.dumps(sidecar, ensure_ascii=False).encode('utf-8'))
            _write_atomically(path, bytes(data))
            self._touched(path)

        await anyio.to_thread.run_sync(write)
        return uri

    def _reuse(self, path: Path, data: bytes) -> bool:
        """Touch the stored file if it holds exactly `data`; `False` if it is absent or damaged."""
        key = os.fspath(path)
        try:
            status = os.lstat(path)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(status.st_mode) or status.st_size != len(data):
            return False
        if self._checked.get(key) != _fingerprint(status) and not _holds(path, data):
            return False
        return self._touched(path)

    def _touched(self, path: Path) -> bool:
        """Touch the file and remember its fingerprint as checked; whether it exists."""
        key = os.fspath(path)
        if not _touch(path):
            self._checked.pop(key)
            return False
        with contextlib.suppress(FileNotFoundError):
            self._checked.put(key, _fingerprint(os.lstat(path)))
        return True

    async def get(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bytes:
        path = self.path_for(uri, context=context)
        try:
            data = await anyio.to_thread.run_sync(path.read_bytes)
        except FileNotFoundError:
            raise FileNotFoundError(f'blob {uri} is not in {self.directory}') from None
        return check_digest(uri, data)

    async def exists(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        return await anyio.to_thread.run_sync(self.path_for(uri, context=context).is_file)

    async def public_url(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str | None:
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Mapping[str, str]:
        path = self.path_for(uri, context=context)

        def read() -> Any:
            if not path.is_file():
                raise FileNotFoundError(f'blob {uri} is not in {self.directory}')
            try:
                return json.loads(self._sidecar(path).read_bytes())
            except FileNotFoundError:
                return {'metadata': {}}

        sidecar = await anyio.to_thread.run_sync(read)
        metadata = sidecar.get('metadata') if isinstance(sidecar, dict) else None
        if not isinstance(metadata, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
        ):
            raise ValueError(f'metadata sidecar of blob {uri} is malformed')
        return metadata

    async def touch(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        return await anyio.to_thread.run_sync(_touch, self.path_for(uri, context=context))

    async def list_blobs(self) -> AsyncIterator[StoredBlob]:
        for blob in await anyio.to_thread.run_sync(self._list_blobs):
            yield blob

    def _list_blobs(self) -> list[StoredBlob]:
        found: list[StoredBlob] = []
        for root, _, names in os.walk(self.directory):
            for name in names:
                if name.startswith('.') or name.endswith(_SIDECAR_SUFFIX):
                    continue  # temporary files, blobs being deleted, metadata
                path = Path(root, name)
                key = path.relative_to(self.directory).as_posix()
                uri = uri_of_key(key)
                if uri is None:
                    continue
                try:
                    found.append(StoredBlob(uri, key, _modified(path)))
                except FileNotFoundError:
                    continue
        return found

    async def delete_blob(self, blob: StoredBlob, *, touched_before: datetime | None = None) -> bool:
        """Delete the blob's file and sidecar.

        The file is first renamed aside (atomically), then its modification time is checked: a
        blob touched since `touched_before` is put back (unless it was stored again meanwhile). A
        writer's `touch` either happens before the rename (and is seen) or fails (and the writer
        puts the blob again). A read of a blob being put back fails in that instant, and a crash
        between the rename and the end leaves the renamed file (a dot file, never listed).
        """
        path = self.directory.joinpath(*blob.key.split('/'))

        def delete() -> bool:
            aside = path.with_name(f'.{path.name}.{secrets.token_hex(6)}.deleting')
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                return False
            if touched_before is not None and _modified(aside) >= touched_before:
                with contextlib.suppress(FileExistsError):  # stored again meanwhile
                    os.link(aside, path)
                aside.unlink()
                return False
            if not path.exists():  # not stored again meanwhile
                self._sidecar(path).unlink(missing_ok=True)
            aside.unlink()
            return True

        return await anyio.to_thread.run_sync(delete)

    async def aclose(self) -> None:
        """Nothing to release; here so every media store can be closed the same way."""
