"""Rows of the `media` table: the one statement that writes them, and blobs staged for a transaction.

`SqlMediaStore.put` writes a blob row in a transaction of its own. A step store whose media
store is the `SqlMediaStore` on its own database packs messages before its write transaction,
through `StagedBlobs`: puts only collect rows, which the write transaction then inserts with
the messages that refer to them. A snapshot and its blobs therefore commit together (with a
caller's `AsyncConnection`, the caller's rollback removes both), and the walker's puts never
run inside a transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from step_persistence.media.clock import media_now
from step_persistence.media.protocol import NO_CONTEXT, MediaContext, MediaStore, TouchableMediaStore
from step_persistence.media.uri import media_uri_for, parse_media_uri
from step_persistence.stores.sql.dialects import dialect_insert
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.schema import media

__all__ = ['BlobWriter', 'StagedBlobs', 'blob_row']


def blob_row(uri: str, data: bytes, context: MediaContext) -> dict[str, Any]:
    """The `media` row that stores `data` under `uri` (`media_uri_for(data)`) with the context's description."""
    return {
        'digest': parse_media_uri(uri),
        'data': bytes(data),
        'media_type': context.media_type,
        'filename': context.filename,
        'metadata': dict(context.metadata),
        'created_at': media_now(),
    }


class BlobWriter:
    """Inserts blob rows; a blob already stored is left as it is (its first description wins), unless its
    stored bytes differ from the row's (damaged behind the store's back): then they are written again.

    The row's bytes hash to its digest by construction, so a stored row whose bytes differ is corrupt.
    The comparison happens in the database and only on a conflict, so a new blob costs what it did.
    """

    def __init__(self, dialect_name: str) -> None:
        insert = dialect_insert(dialect_name)(media)
        excluded = insert.excluded
        self._insert = Prepared(
            insert.on_conflict_do_update(
                index_elements=[media.c.digest],
                set_={'data': excluded.data, 'touched_at': excluded.created_at},
                where=media.c.data.is_distinct_from(excluded.data),
            )
        )

    def write(self, transaction: Transaction, blob_rows: list[dict[str, Any]]) -> None:
        if blob_rows:
            transaction.execute(self._insert, blob_rows)


class StagedBlobs:
    """A media store for one write operation: `put` stages a row for the operation's transaction to insert.

    Reads (`get`, `exists`, ...) go to `store`, the SQL media store of the same database; a
    staged blob also `exists`.
    """

    transactional = True
    """Staged rows are written by a transaction that may roll back: the media walker must not remember them."""

    def __init__(self, store: MediaStore) -> None:
        self._store = store
        self._rows: dict[str, dict[str, Any]] = {}

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows staged so far, one per blob."""
        return list(self._rows.values())

    async def put(self, data: bytes, *, context: MediaContext = NO_CONTEXT) -> str:
        uri = media_uri_for(data)
        row = blob_row(uri, data, context)
        self._rows.setdefault(row['digest'], row)
        return uri

    async def get(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bytes:
        return await self._store.get(uri, context=context)

    async def exists(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        return parse_media_uri(uri) in self._rows or await self._store.exists(uri, context=context)

    async def touch(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        """Refresh a stored blob's touched time (in a transaction of its own) before a message reuses it."""
        if parse_media_uri(uri) in self._rows:
            return True
        if isinstance(self._store, TouchableMediaStore):
            return await self._store.touch(uri, context=context)
        return await self._store.exists(uri, context=context)

    async def public_url(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str | None:
        return await self._store.public_url(uri, context=context)

    async def get_metadata(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Mapping[str, str]:
        return await self._store.get_metadata(uri, context=context)
