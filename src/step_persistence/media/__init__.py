"""Content-addressed storage of large payloads, so that snapshots stay small.

`externalize_media` moves every `BinaryContent` payload and every large string of a message
tree into a `MediaStore` and leaves versioned markers holding `media+sha256://` URIs in their
place; `restore_media` puts the original bytes and text back. See docs/media.md.
"""

from typing import TYPE_CHECKING

from step_persistence._lazy import lazy_exports
from step_persistence.media.clock import REUSE_WINDOW
from step_persistence.media.keys import default_key_strategy, make_static_public_url
from step_persistence.media.protocol import (
    CollectableMediaStore,
    KeyStrategy,
    MediaContext,
    MediaStore,
    PublicUrlResolver,
    StoredBlob,
    TouchableMediaStore,
)
from step_persistence.media.uri import media_uri_for, parse_media_uri
from step_persistence.media.walker import externalize_media, restore_media

if TYPE_CHECKING:
    from step_persistence.media.disk import DiskMediaStore
    from step_persistence.media.s3 import S3MediaStore
    from step_persistence.stores.mongo.media_store import MongoMediaStore
    from step_persistence.stores.sql import PostgresMediaStore, SqliteMediaStore, SqlMediaStore

_LAZY: dict[str, str] = {
    'DiskMediaStore': 'step_persistence.media.disk',
    'S3MediaStore': 'step_persistence.media.s3',
    'MongoMediaStore': 'step_persistence.stores.mongo.media_store',
    'PostgresMediaStore': 'step_persistence.stores.sql',
    'SqlMediaStore': 'step_persistence.stores.sql',
    'SqliteMediaStore': 'step_persistence.stores.sql',
}
"""Stores imported on first use: the MongoDB driver is optional, SQLAlchemy is heavy, and a store of one kind
(the SQL store importing `media.clock`, say) need not load the disk and S3 stores."""

__all__ = [
    'REUSE_WINDOW',
    'CollectableMediaStore',
    'DiskMediaStore',
    'KeyStrategy',
    'MediaContext',
    'MediaStore',
    'MongoMediaStore',
    'PostgresMediaStore',
    'PublicUrlResolver',
    'S3MediaStore',
    'SqlMediaStore',
    'SqliteMediaStore',
    'StoredBlob',
    'TouchableMediaStore',
    'default_key_strategy',
    'externalize_media',
    'make_static_public_url',
    'media_uri_for',
    'parse_media_uri',
    'restore_media',
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
