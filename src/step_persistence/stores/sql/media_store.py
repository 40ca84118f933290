"""`SqlMediaStore`: one row per blob in the `media` table of a step-persistence database.

`SqlMediaStore` takes a URL, an `AsyncEngine` or an `AsyncConnection`, with the same ownership
rules as `SqlStepStore`; `SqliteMediaStore` and `PostgresMediaStore` (in `sqlite.py` and
`postgres.py`) are its named front doors. A `SqlStepStore` with `media_store='auto'` uses one on
its own database and writes the blob rows in its own write transactions (see `blobs.py` and
docs/sql.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update

from step_persistence.media.clock import media_now
from step_persistence.media.keys import resolve_public_url
from step_persistence.media.protocol import NO_CONTEXT, MediaContext, PublicUrlResolver, StoredBlob
from step_persistence.media.uri import check_digest, media_uri_for, parse_media_uri
from step_persistence.stores.sql.blobs import BlobWriter, blob_row
from step_persistence.stores.sql.database import Database, DatabaseTarget
from step_persistence.stores.sql.database_store import DatabaseStore
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.schema import media

__all__ = ['SqlMediaStore']


class SqlMediaStore(DatabaseStore):
    """Content-addressed blobs as rows of the `media` table (SQLite `BLOB`, PostgreSQL `BYTEA`).

    `target` is a URL (`sqlite:///runs.db`, `postgresql://...`; the store owns its engine and
    disposes of it in `aclose()`), an application's `AsyncEngine` (never disposed) or
    `AsyncConnection` (blobs are written in the caller's transaction, never committed, rolled
    back or closed by the store). `schema` (PostgreSQL only) and `auto_migrate` work as for
    `SqlStepStore`: the tables are shared with it, and either store can create them.

    One row per blob, keyed by its SHA-256: putting stored bytes again writes nothing (`INSERT ...
    ON CONFLICT DO NOTHING`) and keeps the first put's `media_type`, `filename` and metadata. A
    read checks the bytes against the digest (`ValueError` if they differ). Rows are addressed by
    digest, so there is no key strategy; `public_url` resolves URLs for blobs served elsewhere.
    A blob's touched time is `touched_at` (or `created_at` when it was never touched): `put` of
    stored bytes and `touch` set it; `delete_blob` checks it in its `DELETE` statement.
    """

    transactional = True
    """Writes join a database transaction that may roll back; the media walker must not remember them."""

    def __init__(
        self,
        target: DatabaseTarget,
        *,
        schema: str | None = None,
        auto_migrate: bool = True,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        self._start(Database.open(target, schema=schema), auto_migrate=auto_migrate, public_url=public_url)

    def _start(
        self,
        database: Database,
        *,
        auto_migrate: bool,
        public_url: PublicUrlResolver | None,
        owns_database: bool = True,
    ) -> None:
        """Build the store on `database` (what every constructor of this class and of its front doors ends in)."""
        self._attach(database, auto_migrate=auto_migrate, owns_database=owns_database)
        self._public_url = public_url
        self._blobs = BlobWriter(database.dialect_name)

    @classmethod
    def sharing(cls, database: Database, *, auto_migrate: bool) -> SqlMediaStore:
        """For step_persistence's own use: the default media store of a `SqlStepStore`, on the step store's
        `database`, which it never closes (the step store stages its puts in its own transactions)."""
        store = cls.__new__(cls)
        store._start(database, auto_migrate=auto_migrate, public_url=None, owns_database=False)
        return store

    async def put(self, data: bytes, *, context: MediaContext = NO_CONTEXT) -> str:
        uri = media_uri_for(data)
        row = blob_row(uri, data, context)

        def write(transaction: Transaction) -> None:
            if not self._touch(transaction, row['digest']):
                self._blobs.write(transaction, [row])

        await self._ready()
        await self._db.run(write, write=True)
        return uri

    @staticmethod
    def _touch(transaction: Transaction, digest: str) -> bool:
        statement = update(media).where(media.c.digest == digest).values(touched_at=media_now())
        return bool(transaction.execute(statement).rowcount)

    async def touch(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        digest = parse_media_uri(uri)
        await self._ready()
        return await self._db.run(lambda transaction: self._touch(transaction, digest), write=True)

    async def list_blobs(self) -> AsyncIterator[StoredBlob]:
        statement = select(media.c.digest, func.coalesce(media.c.touched_at, media.c.created_at))
        await self._ready()
        rows = await self._db.run(lambda transaction: transaction.execute(statement).all(), write=False)
        for digest, touched in rows:
            yield StoredBlob(f'media+sha256://{digest}', digest, touched)

    async def delete_blob(self, blob: StoredBlob, *, touched_before: datetime | None = None) -> bool:
        """Delete the row; with `touched_before`, in the same statement that checks its touched time."""
        statement = delete(media).where(media.c.digest == blob.key)
        if touched_before is not None:
            statement = statement.where(func.coalesce(media.c.touched_at, media.c.created_at) < touched_before)
        await self._ready()
        return await self._db.run(lambda transaction: bool(transaction.execute(statement).rowcount), write=True)

    async def _column(self, uri: str, column: str) -> Any:
        """The blob's value in `column`; `FileNotFoundError` if there is no such blob."""
        statement = select(media.c[column]).where(media.c.digest == parse_media_uri(uri))
        await self._ready()
        row = await self._db.run(lambda transaction: transaction.execute(statement).first(), write=False)
        if row is None:
            raise FileNotFoundError(f'blob {uri} is not in the media table of {self._db.description}')
        return row[0]

    async def get(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bytes:
        return check_digest(uri, bytes(await self._column(uri, 'data')))

    async def exists(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        try:
            await self._column(uri, 'digest')
        except FileNotFoundError:
            return False
        return True

    async def public_url(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str | None:
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Mapping[str, str]:
        metadata = await self._column(uri, 'metadata')
        if not isinstance(metadata, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
        ):
            raise ValueError(f'metadata of blob {uri} is malformed')
        return metadata
