"""Content addresses of blobs: `media+sha256://<64 lowercase hex>`."""

from __future__ import annotations

import hashlib
import re

__all__ = ['URI_SCHEME', 'check_digest', 'media_uri_for', 'parse_media_uri']

URI_SCHEME = 'media+sha256://'
"""The prefix of every media URI; the rest is the SHA-256 of the blob's bytes, lowercase hex."""

_URI = re.compile(r'media\+sha256://([0-9a-f]{64})')


def media_uri_for(data: bytes) -> str:
    """The content address of `data`: `media+sha256://` followed by its SHA-256 in lowercase hex."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f'media data must be bytes, got {type(data).__name__}')
    return URI_SCHEME + hashlib.sha256(data).hexdigest()


def parse_media_uri(uri: str) -> str:
    """The SHA-256 digest (64 lowercase hex characters) named by `uri`; `ValueError` for anything else."""
    match = _URI.fullmatch(uri) if isinstance(uri, str) else None
    if match is None:
        raise ValueError(f'not a media URI (expected {URI_SCHEME}<64 lowercase hex>): {uri!r}')
    return match.group(1)


def check_digest(uri: str, data: bytes) -> bytes:
    """Return `data` if its SHA-256 is the one `uri` names; raise `ValueError` if the bytes do not match."""
    expected = parse_media_uri(uri)
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ValueError(f'blob {uri} is corrupt: its bytes hash to sha256 {actual}')
    return data
