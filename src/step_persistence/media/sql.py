"""SQL media stores: one row per blob in the `media` table of a step-persistence database.

`SqlMediaStore` takes a URL, an `AsyncEngine` or an `AsyncConnection`, with the same ownership
rules as `SqlStepStore`; `SqliteMediaStore` and `PostgresMediaStore` are its named front doors.
A `SqlStepStore` with `media_store='auto'` uses one on its own database and writes the blob rows
in its own write transactions (see `stores/sql/blobs.py` and docs/sql.md).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from step_persistence.media.clock import media_now
from step_persistence.media.keys import resolve_public_url
from step_persistence.media.protocol import NO_CONTEXT, MediaContext, PublicUrlResolver, StoredBlob
from step_persistence.media.uri import check_digest, media_uri_for, parse_media_uri
from step_persistence.stores.sql.blobs import BlobWriter, blob_row
from step_persistence.stores.sql.database import DEFAULT_BUSY_TIMEOUT, Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.schema import media

__all__ = ['PostgresMediaStore', 'SqlMediaStore', 'SqliteMediaStore']


class SqlMediaStore:
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
        target: str | URL | AsyncEngine | AsyncConnection | Database,
        *,
        schema: str | None = None,
        auto_migrate: bool = True,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        self._db = Database.open(target, schema=schema)
        self._owns_database = True
        self._auto_migrate = auto_migrate
        self._public_url = public_url
        self._blobs = BlobWriter(self._db.dialect_name)

    @classmethod
    def sharing(
        cls, database: Database, *, auto_migrate: bool, public_url: PublicUrlResolver | None = None
    ) -> SqlMediaStore:
        """A media store on a step store's database, which it never closes (the step store stages its puts)."""
        store = cls(database, auto_migrate=auto_migrate, public_url=public_url)
        store._owns_database = False
        return store

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self._db.description})'

    async def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (what `auto_migrate` does on first use)."""
        await self._db.migrate()

    async def _ready(self) -> None:
        await self._db.ready(auto_migrate=self._auto_migrate)

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

    async def aclose(self) -> None:
        """Dispose of the engine if this store created it from a URL; a shared database is left alone."""
        if self._owns_database:
            await self._db.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class SqliteMediaStore(SqlMediaStore):
    """A SQL media store on SQLite: a path (default `runs.db`, created on first use), `':memory:'`,
    a caller's `sqlite3.Connection` (`connection=`), or a SQLite `AsyncEngine`/`AsyncConnection`,
    with the same ownership and commit rules as `SqliteStepStore`."""

    def __init__(
        self,
        database: str | os.PathLike[str] | AsyncEngine | AsyncConnection | None = None,
        *,
        connection: sqlite3.Connection | None = None,
        auto_migrate: bool = True,
        public_url: PublicUrlResolver | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        super().__init__(
            Database.for_sqlite(database, connection=connection, busy_timeout=busy_timeout, owner='SqliteMediaStore'),
            auto_migrate=auto_migrate,
            public_url=public_url,
        )


class PostgresMediaStore(SqlMediaStore):
    """A SQL media store on PostgreSQL (asyncpg): a `postgresql://` URL, an `AsyncEngine` or an
    `AsyncConnection`, and an optional schema, as for `PostgresStepStore`."""

    def __init__(
        self,
        url_or_engine: str | URL | AsyncEngine | AsyncConnection,
        schema: str | None = None,
        *,
        auto_migrate: bool = True,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        super().__init__(
            Database.for_postgres(url_or_engine, schema=schema, owner='PostgresMediaStore'),
            auto_migrate=auto_migrate,
            public_url=public_url,
        )
