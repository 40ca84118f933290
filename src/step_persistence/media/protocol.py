"""The `MediaStore` protocol and the `MediaContext` passed to every one of its calls."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Protocol, TypeAlias, runtime_checkable

__all__ = [
    'NO_CONTEXT',
    'CollectableMediaStore',
    'KeyStrategy',
    'MediaContext',
    'MediaStore',
    'PublicUrlResolver',
    'StoredBlob',
    'TouchableMediaStore',
]


@dataclass(frozen=True, kw_only=True)
class MediaContext:
    """What a caller knows about a blob besides its bytes.

    Stores use `media_type` (e.g. as `Content-Type`), keep `metadata` for `get_metadata`, and
    hand the whole context to key strategies and public-URL resolvers. Pass the same context to
    `get`, `exists`, `public_url` and `get_metadata` as to `put` when a key strategy depends on it.
    """

    media_type: str | None = None
    filename: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict[str, str])
    """User metadata, `str` to `str`; stored with the blob and returned by `get_metadata`."""

    def __post_init__(self) -> None:
        for name in ('media_type', 'filename'):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f'MediaContext.{name} must be a str or None, got {type(value).__name__}')
        metadata = dict(self.metadata)
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f'MediaContext.metadata must map str to str, got {key!r}: {value!r}')
        object.__setattr__(self, 'metadata', MappingProxyType(metadata))


NO_CONTEXT = MediaContext()
"""The default context: nothing known about the blob."""

KeyStrategy: TypeAlias = Callable[[str, MediaContext], str]
"""`(uri, context) -> key`: where a store puts a blob, relative to its root or prefix.

`uri` is the blob's `media+sha256://<sha256>` URI (checked before the strategy is called), so
`uri.removeprefix('media+sha256://')` is its digest. A key is a `/`-separated relative path;
stores reject absolute keys and `..` segments with `ValueError`. A strategy must be
deterministic: `get` recomputes the key from the same inputs.
"""

PublicUrlResolver: TypeAlias = Callable[[str, MediaContext], str | Awaitable[str | None] | None]
"""`(uri, context) -> url or None`, sync or async: how a blob can be fetched without this library."""


@runtime_checkable
class MediaStore(Protocol):
    """Content-addressed blob storage: a blob's URI is `media_uri_for(its bytes)`.

    Every method takes a keyword-only `context` (default `MediaContext()`). Putting bytes that
    are already stored stores nothing new and keeps the metadata of the first put. Methods given
    a malformed URI raise `ValueError`.
    """

    async def put(self, data: bytes, *, context: MediaContext = NO_CONTEXT) -> str:
        """Store `data`; return its URI."""
        ...

    async def get(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bytes:
        """The blob's bytes; `FileNotFoundError` if absent, `ValueError` if they no longer match the URI."""
        ...

    async def exists(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        """Whether the blob is stored."""
        ...

    async def public_url(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str | None:
        """A URL that serves the blob without this library, or `None` when the store has no resolver."""
        ...

    async def get_metadata(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Mapping[str, str]:
        """The user metadata stored with the blob; `FileNotFoundError` if the blob is absent."""
        ...


@runtime_checkable
class TouchableMediaStore(MediaStore, Protocol):
    """A media store that records when each blob was last written or reused (its touched time).

    `put` of bytes already stored refreshes their touched time. The media walker calls `touch`
    instead of `exists` before it reuses a stored blob, so a blob a writer relies on is never
    older than `REUSE_WINDOW` (see `step_persistence.media.clock`).
    """

    async def touch(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        """Refresh the blob's touched time to now; return whether the blob is stored."""
        ...


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """One blob as a collectable media store lists it."""

    uri: str
    key: str
    """Where the store keeps it: a path under its directory, an object key, a manifest id, a digest."""
    touched_at: datetime
    """When it was last written or touched (aware, UTC)."""


@runtime_checkable
class CollectableMediaStore(TouchableMediaStore, Protocol):
    """A media store whose blobs can be listed and deleted, so that `collect_media` can reclaim them.

    Only blobs whose key names their digest (the key's last segment starts with the 64 hex digits,
    as every built-in key strategy does) are listed; anything else under the store's root is left
    alone.
    """

    def list_blobs(self) -> AsyncIterator[StoredBlob]:
        """Every blob the store holds, in no particular order."""
        ...

    async def delete_blob(self, blob: StoredBlob, *, touched_before: datetime | None = None) -> bool:
        """Delete a listed blob (with its metadata); return whether it was deleted.

        With `touched_before`, a blob touched at or after that instant (since it was listed) is
        kept; stores check this atomically with the deletion where their storage allows it (see
        docs/media.md). A blob already gone is not an error (returns `False`).
        """
        ...
