"""Where blobs live (key strategies) and how they are reached from outside (public URLs)."""

from __future__ import annotations

import inspect
import re
from urllib.parse import quote

from step_persistence.media.protocol import KeyStrategy, MediaContext, PublicUrlResolver
from step_persistence.media.uri import parse_media_uri

__all__ = ['blob_key', 'default_key_strategy', 'make_static_public_url', 'resolve_public_url', 'uri_of_key']

_DIGEST_NAME = re.compile(r'([0-9a-f]{64})(?:\..*)?')


def default_key_strategy(uri: str, context: MediaContext) -> str:
    """`<sha256>.bin`: one flat namespace, independent of the context."""
    return f'{parse_media_uri(uri)}.bin'


def uri_of_key(key: str) -> str | None:
    """The media URI a stored key names: its last segment is the digest, optionally with a suffix
    (`<sha256>.bin`, `images/<sha256>.png`, `<sha256>`); `None` for a key that names no digest."""
    match = _DIGEST_NAME.fullmatch(key.rsplit('/', 1)[-1])
    return None if match is None else f'media+sha256://{match.group(1)}'


def blob_key(key_strategy: KeyStrategy, uri: str, context: MediaContext) -> str:
    """The key `key_strategy` gives the blob at `uri` (called with the URI, checked first), checked to
    be a safe relative path.

    Raises `ValueError` for a malformed URI and for a key that is empty, absolute (`/x`, `\\x`,
    `C:x`), contains NUL or backslashes, or has an empty, `.` or `..` segment.
    """
    parse_media_uri(uri)
    key = key_strategy(uri, context)
    if not isinstance(key, str) or not key:
        raise ValueError(f'key strategy returned {key!r}; a key must be a non-empty str')
    if '\x00' in key or '\\' in key:
        raise ValueError(f'key strategy returned {key!r}; a key may not contain NUL or backslashes')
    if key.startswith('/') or (len(key) > 1 and key[1] == ':'):
        raise ValueError(f'key strategy returned the absolute path {key!r}; keys must be relative')
    if any(segment in ('', '.', '..') for segment in key.split('/')):
        raise ValueError(f'key strategy returned {key!r}; empty, "." and ".." segments are not allowed')
    return key


def make_static_public_url(
    base: str,
    key_prefix: str = '',
    *,
    extension: str | None = None,
    key_strategy: KeyStrategy | None = None,
) -> PublicUrlResolver:
    """A resolver for blobs served as static files: `<base>/<key_prefix><key>`.

    The key is `<sha256><extension>` (`extension` defaults to `.bin`, the default key strategy's),
    or the key `key_strategy` gives; pass one of the two, not both. Use the key strategy (and the
    S3 store's `key_prefix`) of the store whose files or objects `base` serves, e.g.
    `make_static_public_url('https://cdn.example.com', key_prefix='media/')` for an
    `S3MediaStore(..., key_prefix='media/')` behind that CDN. The key is percent-encoded per path
    segment. `TypeError` for an argument of the wrong type, `ValueError` for both `extension` and
    `key_strategy`, or an extension with `/`, `\\` or NUL.
    """
    for name, value in (('base', base), ('key_prefix', key_prefix)):
        if not isinstance(value, str):
            raise TypeError(f'{name} must be a str, got {type(value).__name__}')
    strategy = _strategy(extension, key_strategy)
    root = base.rstrip('/')

    def resolve(uri: str, context: MediaContext) -> str:
        key = blob_key(strategy, uri, context)
        return f'{root}/{quote(key_prefix + key, safe="/")}'

    return resolve


def _strategy(extension: str | None, key_strategy: KeyStrategy | None) -> KeyStrategy:
    """The key strategy `make_static_public_url` was given, directly or as an extension."""
    if extension is None:
        if key_strategy is not None and not callable(key_strategy):
            raise TypeError(f'key_strategy must be callable, got {type(key_strategy).__name__}')
        return default_key_strategy if key_strategy is None else key_strategy
    if key_strategy is not None:
        raise ValueError('give make_static_public_url an extension or a key_strategy, not both')
    if not isinstance(extension, str):
        raise TypeError(f'extension must be a str, got {type(extension).__name__}')
    if any(character in extension for character in '/\\\x00'):
        raise ValueError(f'extension must not contain "/", "\\" or NUL, got {extension!r}')

    def with_extension(uri: str, context: MediaContext) -> str:
        return parse_media_uri(uri) + extension

    return with_extension


async def resolve_public_url(resolver: PublicUrlResolver | None, uri: str, context: MediaContext) -> str | None:
    """Run a sync or async resolver (after checking `uri`); `None` when there is no resolver."""
    parse_media_uri(uri)
    if resolver is None:
        return None
    url = resolver(uri, context)
    if inspect.isawaitable(url):
        url = await url
    return url
