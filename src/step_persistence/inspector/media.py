"""Media in stored messages, as the inspector serves them: digests, safe media types, finding a blob.

A snapshot read from a store holds its media restored (the bytes the media store keeps, or the
inline bytes of a store without one). The inspector names each blob by the SHA-256 of its bytes,
the digest of its `media+sha256://` URI, and serves it from the snapshot it appears in, with the
media type the message part stored. Stored media types come from models and tools: one that is not
a plain `type/subtype` is served as `application/octet-stream`, and only raster images are shown
inline; everything else is offered as a download (see `app.py`'s media route).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    'FALLBACK_MEDIA_TYPE',
    'INLINE_IMAGE_TYPES',
    'Blob',
    'as_blob',
    'blob_digest',
    'blobs_in',
    'find_blob',
    'is_digest',
    'served_media_type',
]

INLINE_IMAGE_TYPES = frozenset({'image/png', 'image/jpeg', 'image/gif', 'image/webp', 'image/avif', 'image/bmp'})
"""Media types a page shows in an `<img>`: raster formats, which carry no script (SVG does)."""

_MEDIA_TYPE = re.compile(r'[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}')
_DIGEST = re.compile(r'[0-9a-f]{64}')
FALLBACK_MEDIA_TYPE = 'application/octet-stream'


@dataclass(frozen=True)
class Blob:
    """One binary payload of a message: its bytes and the media type to serve them with."""

    data: bytes
    media_type: str
    """`served_media_type` of the stored one."""

    @property
    def digest(self) -> str:
        return blob_digest(self.data)

    @property
    def inline(self) -> bool:
        """Whether a page shows it as an image."""
        return self.media_type in INLINE_IMAGE_TYPES


def blob_digest(data: bytes) -> str:
    """The SHA-256 of `data` in lowercase hex: the digest of its `media+sha256://` URI."""
    return hashlib.sha256(data).hexdigest()


def is_digest(text: object) -> bool:
    """Whether `text` is a digest as `blob_digest` spells it (so a request names a blob, nothing else)."""
    return isinstance(text, str) and _DIGEST.fullmatch(text) is not None


def served_media_type(stored: object) -> str:
    """The stored media type, lower-cased, if it is a plain `type/subtype` (parameters dropped); else
    `application/octet-stream`."""
    if not isinstance(stored, str):
        return FALLBACK_MEDIA_TYPE
    essence = stored.split(';', 1)[0].strip().lower()
    return essence if _MEDIA_TYPE.fullmatch(essence) else FALLBACK_MEDIA_TYPE


def as_blob(node: Any) -> Blob | None:
    """The blob a dumped message node is (`{'kind': 'binary', 'data': bytes, ...}`), or `None`."""
    if isinstance(node, dict) and node.get('kind') == 'binary' and isinstance(node.get('data'), bytes):
        return Blob(data=node['data'], media_type=served_media_type(node.get('media_type')))
    return None


def blobs_in(tree: Any) -> Iterator[Blob]:
    """Every blob in a dumped message tree (`ModelMessagesTypeAdapter.dump_python`), depth first."""
    blob = as_blob(tree)
    if blob is not None:
        yield blob
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from blobs_in(value)
    elif isinstance(tree, list | tuple):
        for item in tree:
            yield from blobs_in(item)


def find_blob(tree: Any, digest: str) -> Blob | None:
    """The first blob of `tree` whose bytes have `digest`, or `None`."""
    return next((blob for blob in blobs_in(tree) if blob.digest == digest), None)
