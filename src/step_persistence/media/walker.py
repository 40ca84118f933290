"""Moving large payloads of a message tree out to a `MediaStore`, and back.

The tree is the JSON form of pydantic-ai messages (`ModelMessagesTypeAdapter.dump_python(...,
mode='json')`, or one message of it): dicts, lists, strings, numbers, booleans and `None`.
`externalize_media` replaces payloads by markers and stores the payloads; `restore_media` does
the reverse and gives back an equal tree, every string identical. The marker format is
documented in docs/media.md.

Marker format, version 1. Every dict of an externalized tree that has the key `MARKER_KEY` is a
directive, and has no other key. Its value is an object with the format version `v` and either
- `uri`, `encoding`, `media_type`, `size`: a string stored as a blob. `encoding` says how the
  blob's bytes give the string back: `base64` or `base64url` (standard or URL-safe alphabet,
  padded: the string was that encoding of the blob) or `utf-8` (the string's UTF-8 bytes);
- `escaped`: a dict of the original tree that had `MARKER_KEY` among its own keys, with its
  values externalized in turn. This keeps a user's data that looks like a marker unambiguous.
"""

from __future__ import annotations

import base64
import binascii
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import anyio

from step_persistence._lru import BoundedLru
from step_persistence.media.clock import REUSE_WINDOW, media_now
from step_persistence.media.protocol import MediaContext, MediaStore, TouchableMediaStore
from step_persistence.media.uri import check_digest, media_uri_for, parse_media_uri

__all__ = [
    'DEFAULT_THRESHOLD_BYTES',
    'MARKER_KEY',
    'MARKER_VERSION',
    'externalize_media',
    'forget_stored_blob',
    'needs_externalizing',
    'restore_media',
    'validate_threshold_bytes',
]

MARKER_KEY: Final = '$step_persistence.media'
"""The one key of a marker (or escape) dict in an externalized tree."""

MARKER_VERSION: Final = 1
"""The marker format this library writes; reading any other version raises `ValueError`."""

DEFAULT_THRESHOLD_BYTES: Final = 64 * 1024
"""Strings of at least this many UTF-8 bytes are externalized by default."""

TEXT_MEDIA_TYPE: Final = 'text/plain; charset=utf-8'
"""The media type under which externalized strings are stored."""

_CONCURRENCY: Final = 8
"""At most this many puts (or gets) of one tree run at once."""

_KNOWN_LIMIT: Final = 100_000
"""How many stored blobs this process remembers per media store (the least recently used are forgotten)."""


@dataclass(frozen=True, slots=True)
class _Blob:
    """One string of the tree, as the blob that stores it."""

    uri: str
    encoding: str
    media_type: str | None
    data: bytes

    def marker(self) -> dict[str, Any]:
        fields = {'v': MARKER_VERSION, 'uri': self.uri, 'encoding': self.encoding}
        return {MARKER_KEY: {**fields, 'media_type': self.media_type, 'size': len(self.data)}}


@dataclass(frozen=True, slots=True)
class _BlobRef:
    """A parsed marker: which blob, and how to turn its bytes back into the string."""

    uri: str
    encoding: str
    media_type: str | None
    size: int

    def text(self, data: bytes) -> str:
        if len(data) != self.size:
            raise ValueError(f'blob {self.uri} has {len(data)} bytes, its marker says {self.size}')
        if self.encoding == 'utf-8':
            return data.decode('utf-8')
        return _BASE64[self.encoding][0](data).decode('ascii')


_BASE64: Final[dict[str, tuple[Callable[[bytes], bytes], Callable[[str], bytes]]]] = {
    'base64url': (base64.urlsafe_b64encode, base64.urlsafe_b64decode),
    'base64': (base64.b64encode, base64.b64decode),
}
"""Encoding name -> (encode, decode). Pydantic writes bytes as URL-safe base64; older data may not be."""

_ENCODINGS: Final = frozenset({*_BASE64, 'utf-8'})


def validate_threshold_bytes(threshold_bytes: int) -> int:
    """Return `threshold_bytes` if it is an int >= 1; otherwise raise `ValueError`."""
    if isinstance(threshold_bytes, bool) or not isinstance(threshold_bytes, int) or threshold_bytes < 1:
        raise ValueError(f'threshold_bytes must be an int >= 1, got {threshold_bytes!r}')
    return threshold_bytes


def _binary_blob(text: str, media_type: str | None) -> _Blob | None:
    """The blob of a `BinaryContent.data` string, if it is base64 that re-encodes to the same text."""
    for encoding, (encode, decode) in _BASE64.items():
        try:
            data = decode(text)
        except (binascii.Error, ValueError):
            continue
        if encode(data).decode('ascii') == text:
            return _Blob(media_uri_for(data), encoding, media_type, data)
    return None


def _is_large(text: str, threshold: int) -> bool:
    if len(text) >= threshold:
        return True
    return len(text) * 4 >= threshold and len(text.encode('utf-8', 'surrogatepass')) >= threshold


def _text_blob(text: str, threshold: int) -> _Blob | None:
    """The blob of a large string; `None` for a small one or one that is not valid Unicode."""
    if not _is_large(text, threshold):
        return None
    try:
        data = text.encode('utf-8')
    except UnicodeEncodeError:
        return None
    return _Blob(media_uri_for(data), 'utf-8', TEXT_MEDIA_TYPE, data)


def _is_binary(node: dict[Any, Any]) -> bool:
    return node.get('kind') == 'binary' and isinstance(node.get('data'), str)


def _media_type_of(node: dict[Any, Any]) -> str | None:
    media_type = node.get('media_type')
    return media_type if isinstance(media_type, str) else None


def _needs_externalizing(node: Any, threshold: int) -> bool:
    """Whether `externalize_media` would change anything: a read-only scan that stops at the first hit."""
    if isinstance(node, str):
        return _is_large(node, threshold)
    if isinstance(node, list):
        return any(_needs_externalizing(item, threshold) for item in node)
    if isinstance(node, dict):
        if MARKER_KEY in node or _is_binary(node):
            return True
        return any(_needs_externalizing(value, threshold) for value in node.values())
    return False


def needs_externalizing(tree: Any, *, threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> bool:
    """Whether `externalize_media` would change `tree` (store anything): synchronous, read-only."""
    return _needs_externalizing(tree, validate_threshold_bytes(threshold_bytes))


def _externalize(node: Any, threshold: int, blobs: dict[tuple[str, str | None], _Blob]) -> Any:
    """A copy of `node` with payloads replaced by markers; the blobs to store are added to `blobs`."""
    if isinstance(node, str):
        blob = _text_blob(node, threshold)
        if blob is None:
            return node
        blobs[(blob.uri, blob.media_type)] = blob
        return blob.marker()
    if isinstance(node, list):
        return [_externalize(item, threshold, blobs) for item in node]
    if not isinstance(node, dict):
        return node
    binary = _binary_blob(node['data'], _media_type_of(node)) if _is_binary(node) else None
    if binary is not None:
        blobs[(binary.uri, binary.media_type)] = binary
    out = {
        key: binary.marker() if binary is not None and key == 'data' else _externalize(value, threshold, blobs)
        for key, value in node.items()
    }
    if MARKER_KEY in node:
        return {MARKER_KEY: {'v': MARKER_VERSION, 'escaped': out}}
    return out


def _directive(node: dict[Any, Any]) -> _BlobRef | dict[Any, Any]:
    """Parse a dict holding `MARKER_KEY`: a blob reference, or the escaped dict; `ValueError` if malformed."""
    body = node[MARKER_KEY]
    if len(node) != 1 or not isinstance(body, dict):
        raise ValueError(f'malformed media marker: {node!r:.200}')
    version = body.get('v')
    if type(version) is not int:
        raise ValueError(f'malformed media marker (no integer version): {node!r:.200}')
    if version != MARKER_VERSION:
        raise ValueError(
            f'media marker version {version!r} is not supported: this version of step-persistence '
            f'reads version {MARKER_VERSION} only (a newer step-persistence may have written it)'
        )
    if body.keys() == {'v', 'escaped'} and isinstance(body['escaped'], dict):
        return body['escaped']
    if body.keys() != {'v', 'uri', 'encoding', 'media_type', 'size'}:
        raise ValueError(f'malformed media marker: {node!r:.200}')
    uri, encoding, media_type, size = body['uri'], body['encoding'], body['media_type'], body['size']
    parse_media_uri(uri)
    if encoding not in _ENCODINGS or not (media_type is None or isinstance(media_type, str)) or type(size) is not int:
        raise ValueError(f'malformed media marker: {node!r:.200}')
    return _BlobRef(uri, encoding, media_type, size)


def _references(node: Any, found: dict[tuple[str, str | None], _BlobRef]) -> bool:
    """Collect the blob references under `node`; return whether restoring changes anything."""
    if isinstance(node, list):
        changed = False
        for item in node:
            changed = _references(item, found) or changed
        return changed
    if not isinstance(node, dict):
        return False
    if MARKER_KEY in node:
        directive = _directive(node)
        if isinstance(directive, _BlobRef):
            found[(directive.uri, directive.media_type)] = directive
        else:
            for value in directive.values():
                _references(value, found)
        return True
    changed = False
    for value in node.values():
        changed = _references(value, found) or changed
    return changed


def _restore(node: Any, blobs: dict[tuple[str, str | None], bytes]) -> Any:
    if isinstance(node, list):
        return [_restore(item, blobs) for item in node]
    if not isinstance(node, dict):
        return node
    if MARKER_KEY in node:
        directive = _directive(node)
        if isinstance(directive, _BlobRef):
            return directive.text(blobs[(directive.uri, directive.media_type)])
        node = directive
    return {key: _restore(value, blobs) for key, value in node.items()}


def _puts_to_reuse(store: MediaStore) -> bool:
    """Whether the store's `put` of bytes already stored checks the stored copy against them (and writes
    it again if it differs) at the cost of a `touch`: the walker then calls `put`, never `touch` or
    `exists`, so a save never comes to rely on a damaged copy (`DiskMediaStore`, `S3MediaStore`)."""
    return getattr(store, 'put_checks_stored_copy', False) is True


class _KnownBlobs:
    """Blobs this process has seen stored, per media store (weakly keyed, bounded per store), and when.

    A store whose `transactional` attribute is true is never remembered: its writes belong to a
    database transaction that may still roll back (the SQL media store's do), so having seen a
    blob stored proves nothing about the next call. Nor is one whose `remember_reuse` attribute is
    false (`DiskMediaStore`: checking a blob again is a local `stat`, so every reuse checks it). A
    blob is remembered for `REUSE_WINDOW` only: after that the walker touches it again, so that a
    blob a new message refers to was touched recently and `collect_media` (with a large enough
    grace) cannot take it. A blob that a read finds damaged or missing is forgotten, so the next
    save that needs it checks it (and, through `put`, repairs it) instead of relying on it.
    """

    def __init__(self) -> None:
        self._by_store: weakref.WeakKeyDictionary[Any, BoundedLru[str, dict[str | None, datetime]]] = (
            weakref.WeakKeyDictionary()
        )
        """Per store, by blob URI: when the blob was seen stored, per media type it was stored under."""

    def _of(self, store: MediaStore) -> BoundedLru[str, dict[str | None, datetime]] | None:
        try:
            return self._by_store.get(store)
        except TypeError:  # a store that cannot be weakly referenced is never remembered
            return None

    def contains(self, store: MediaStore, key: tuple[str, str | None]) -> bool:
        uri, media_type = key
        known = self._of(store)
        seen = None if known is None else (known.get(uri) or {}).get(media_type)
        return seen is not None and media_now() - seen < REUSE_WINDOW

    def add(self, store: MediaStore, key: tuple[str, str | None], *, at: datetime | None = None) -> None:
        if getattr(store, 'transactional', False) or getattr(store, 'remember_reuse', True) is False:
            return
        known = self._of(store)
        if known is None:
            try:
                known = self._by_store[store] = BoundedLru(_KNOWN_LIMIT)
            except TypeError:
                return
        uri, media_type = key
        known.get_or_build(uri, dict)[media_type] = media_now() if at is None else at

    def forget(self, store: MediaStore, uri: str) -> None:
        known = self._of(store)
        if known is not None:
            known.pop(uri)


_known = _KnownBlobs()


def forget_stored_blob(media_store: MediaStore, uri: str) -> None:
    """Tell the walker of this process that the blob at `uri` was deleted from `media_store`."""
    _known.forget(media_store, uri)


async def _run_all(jobs: Iterable[Callable[[], Awaitable[None]]]) -> None:
    """Run `jobs` concurrently (bounded); the first error cancels the rest and is raised as is."""
    pending = list(jobs)
    if len(pending) == 1:
        await pending[0]()
        return
    limiter = anyio.CapacityLimiter(_CONCURRENCY)
    errors: list[Exception] = []

    async def run(job: Callable[[], Awaitable[None]], scope: anyio.CancelScope) -> None:
        async with limiter:
            try:
                await job()
            except Exception as error:
                errors.append(error)
                scope.cancel()

    async with anyio.create_task_group() as group:
        for job in pending:
            group.start_soon(run, job, group.cancel_scope)
    if errors:
        raise errors[0]


async def externalize_media(
    tree: Any, *, media_store: MediaStore, threshold_bytes: int = DEFAULT_THRESHOLD_BYTES
) -> Any:
    """Store the payloads of `tree` in `media_store`; return the tree with markers in their place.

    Every `BinaryContent` payload (a dict with `kind: 'binary'` whose `data` is base64) and every
    other string of at least `threshold_bytes` UTF-8 bytes becomes a marker. Blobs already stored
    (stored or touched by this process within `REUSE_WINDOW`, or for which `exists` says so, or
    `touch` on a `TouchableMediaStore`, which also refreshes their touched time) are not sent
    again; the others are put concurrently. A store whose `put` checks a stored copy
    (`put_checks_stored_copy`) gets `put` instead of `touch` or `exists`, so a damaged copy is
    written again rather than relied on. A tree with nothing to externalize is returned as is, not
    copied. `tree` itself is never modified.
    """
    threshold = validate_threshold_bytes(threshold_bytes)
    if not _needs_externalizing(tree, threshold):
        return tree
    blobs: dict[tuple[str, str | None], _Blob] = {}
    result = _externalize(tree, threshold, blobs)

    def storing(blob: _Blob) -> Callable[[], Awaitable[None]]:
        async def store() -> None:
            context = MediaContext(media_type=blob.media_type)
            started = media_now()
            if _puts_to_reuse(media_store):
                stored = False
            elif isinstance(media_store, TouchableMediaStore):
                stored = await media_store.touch(blob.uri, context=context)
            else:
                stored = await media_store.exists(blob.uri, context=context)
            if not stored:
                uri = await media_store.put(blob.data, context=context)
                if uri != blob.uri:
                    raise ValueError(f'{type(media_store).__name__}.put returned {uri!r} for blob {blob.uri}')
            _known.add(media_store, (blob.uri, blob.media_type), at=started)

        return store

    await _run_all(storing(blob) for key, blob in blobs.items() if not _known.contains(media_store, key))
    return result


async def restore_media(tree: Any, *, media_store: MediaStore) -> Any:
    """The tree `externalize_media` was given: every marker replaced by its original string.

    Raises `ValueError` for a malformed marker, one of an unknown format version, or a blob
    whose bytes do not match its URI, and `FileNotFoundError` for a missing blob. A tree without
    markers is returned as is, not copied. Only apply this to trees `externalize_media` produced.
    """
    references: dict[tuple[str, str | None], _BlobRef] = {}
    if not _references(tree, references):
        return tree
    blobs: dict[tuple[str, str | None], bytes] = {}

    def fetching(key: tuple[str, str | None]) -> Callable[[], Awaitable[None]]:
        async def fetch() -> None:
            uri, media_type = key
            try:
                data = check_digest(uri, await media_store.get(uri, context=MediaContext(media_type=media_type)))
            except (ValueError, FileNotFoundError):
                _known.forget(media_store, uri)  # the next save that needs it checks it again
                raise
            blobs[key] = data
            if not isinstance(media_store, TouchableMediaStore):
                _known.add(media_store, key)  # reading a blob does not touch it

        return fetch

    await _run_all(fetching(key) for key in references)
    return _restore(tree, blobs)
