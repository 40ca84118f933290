"""Content-addressed storage of large payloads, so that snapshots stay small.

`externalize_media` moves every `BinaryContent` payload and every large string of a message
tree into a `MediaStore` and leaves versioned markers holding `media+sha256://` URIs in their
place; `restore_media` puts the original bytes and text back. See docs/media.md.
"""

from typing import TYPE_CHECKING, Any

from step_persistence.media.disk import DiskMediaStore
from step_persistence.media.keys import default_key_strategy, make_static_public_url
from step_persistence.media.protocol import KeyStrategy, MediaContext, MediaStore, PublicUrlResolver
from step_persistence.media.s3 import S3MediaStore
from step_persistence.media.uri import media_uri_for, parse_media_uri
from step_persistence.media.walker import externalize_media, restore_media

if TYPE_CHECKING:
    from step_persistence.media.mongo import MongoMediaStore

__all__ = [
    'DiskMediaStore',
    'KeyStrategy',
    'MediaContext',
    'MediaStore',
    'MongoMediaStore',
    'PublicUrlResolver',
    'S3MediaStore',
    'default_key_strategy',
    'externalize_media',
    'make_static_public_url',
    'media_uri_for',
    'parse_media_uri',
    'restore_media',
]


def __getattr__(name: str) -> Any:
    """Import `MongoMediaStore` on first use, so that the package works without the MongoDB driver."""
    if name == 'MongoMediaStore':
        from step_persistence.media.mongo import MongoMediaStore

        return MongoMediaStore
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
