"""`SqlMediaStore`: one row per blob in the `media` table of a step-persistence database.

`SqlMediaStore` takes a URL, an `AsyncEngine` or an `AsyncConnection`, with the same ownership
rules as `SqlStepStore`; `SqliteMediaStore` and `PostgresMediaStore` (in `sqlite.py` and
`postgres.py`) are its named front doors. A `SqlStepStore` with `media_store='auto'` uses one on
its own database and writes the blob rows in its own write transactions (see `blobs.py` and
docs/sql.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import delete, func, inspect, select, update
from sqlalchemy.schema import CreateSchema, CreateTable

from step_persistence._arguments import require_text
from step_persistence._reading import logger, read_each
from step_persistence.media.clock import media_now
from step_persistence.media.keys import resolve_public_url
from step_persistence.media.protocol import NO_CONTEXT, MediaContext, PublicUrlResolver, StoredBlob
from step_persistence.media.uri import check_digest, media_uri_for, parse_media_uri
from step_persistence.stores.sql.blobs import BlobWriter, blob_row
from step_persistence.stores.sql.database import Database, DatabaseTarget
from step_persistence.stores.sql.database_store import DatabaseStore
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.rows import fetch, readable, require_readable
from step_persistence.stores.sql.schema import media
from step_persistence.stores.sql.types import Unreadable

__all__ = ['SqlMediaStore']


_READABLE = {name: readable(media.c[name]) for name in ('data', 'digest', 'metadata')}
"""The columns a read of one blob selects (built once: `readable` registers what it builds)."""

_BLOBS = select(media.c.digest, readable(func.coalesce(media.c.touched_at, media.c.created_at), name='touched'))


def _hashes_to(data: object, digest: str) -> bool:
    return isinstance(data, bytes) and hashlib.sha256(data).hexdigest() == digest


def _blob_name(row: Any) -> str:
    return f'blob row {row.digest!r}'


def _stored_blob(row: Any) -> StoredBlob:
    require_readable(row._mapping, ('touched',))
    digest = row.digest
    uri = f'media+sha256://{digest}'
    if not isinstance(digest, str) or parse_media_uri(uri) != digest:
        raise ValueError('its digest is not a SHA-256 in hex')
    if not isinstance(row.touched, datetime):
        raise ValueError(f'its touched time is {row.touched!r}')
    return StoredBlob(uri, digest, row.touched)


def _has_own_table(transaction: Transaction, *, schema: str | None) -> bool:
    return bool(inspect(transaction.connection).has_table(str(transaction.names.media_table), schema=schema))


def _create_own_table(transaction: Transaction, *, schema: str | None) -> None:
    """The blob table of a media store given `table=`, as the media table is declared, unless it exists."""
    if _has_own_table(transaction, schema=schema):
        return
    connection = transaction.connection
    if schema is not None:
        connection.execute(CreateSchema(schema, if_not_exists=True))
    own = transaction.names.metadata().tables[str(transaction.names.media_table)]
    connection.execute(CreateTable(own), execution_options=transaction.options)


class SqlMediaStore(DatabaseStore):
    """Content-addressed blobs as rows of the `media` table (SQLite `BLOB`, PostgreSQL `BYTEA`).

    `target` is a URL (`sqlite:///runs.db`, `postgresql://...`; the store owns its engine and
    disposes of it in `aclose()`), an application's `AsyncEngine` (never disposed) or
    `AsyncConnection` (blobs are written in the caller's transaction, never committed, rolled
    back or closed by the store). `schema` (PostgreSQL only), `table_prefix` and `auto_migrate` work as for
    `SqlStepStore`: the tables are shared with it, and either store can create them.

    `table='blobs'` keeps the rows in a table of that name instead (lower-case letters, digits and
    underscores): the store creates it, with the media table's columns, at its first write (or
    `migrate()`), and nothing else; reads of a database without it find no blobs. Such a table
    is the media store's alone, outside the migrations' history.

    One row per blob, keyed by its SHA-256: putting stored bytes again writes nothing and keeps the
    first put's `media_type`, `filename` and metadata. A read checks the bytes against the digest
    (`ValueError` if they differ); reusing a blob (`touch`, and `put` of bytes already stored)
    checks them too, and a corrupt row is written again with the bytes being put, so one damaged
    blob never makes a new snapshot unreadable. Rows are addressed by
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
        table_prefix: str = '',
        table: str | None = None,
        auto_migrate: bool = True,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        self._start(
            Database.open(target, schema=schema, table_prefix=table_prefix),
            auto_migrate=auto_migrate,
            public_url=public_url,
            table=table,
        )

    def _start(
        self,
        database: Database,
        *,
        auto_migrate: bool,
        public_url: PublicUrlResolver | None,
        owns_database: bool = True,
        table: str | None = None,
    ) -> None:
        """Build the store on `database` (what every constructor of this class and of its front doors ends in)."""
        if table is not None:
            database.keep_media_in(table)
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

    async def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision; with `table=`, create that table if missing."""
        database = self._db
        if database.names.media_table is None:
            await super().migrate()
            return
        if database.sqlite_file is not None:
            database.sqlite_file.parent.mkdir(parents=True, exist_ok=True)
        await database.run(partial(_create_own_table, schema=database.schema), write=True)
        database.migrated = True

    async def has_schema(self) -> bool:
        """Whether the database holds the store's tables at the revision this version reads (with `table=`:
        whether it holds that table). Creates and migrates nothing."""
        database = self._db
        if database.names.media_table is None or database.migrated:
            return await super().has_schema()
        if database.sqlite_file is not None and not database.sqlite_file.exists():
            return False
        database.migrated = await database.run(partial(_has_own_table, schema=database.schema), write=False)
        return database.migrated

    async def put(self, data: bytes, *, context: MediaContext = NO_CONTEXT) -> str:
        uri = media_uri_for(data)
        row = blob_row(uri, data, context)

        def write(transaction: Transaction) -> None:
            if not self._touch(transaction, row['digest']):
                self._blobs.write(transaction, [row])  # writes the bytes again over a corrupt row

        await self._ready()
        await self._db.run(write, write=True)
        return uri

    def _touch(self, transaction: Transaction, digest: str) -> bool:
        """Refresh the touched time of the blob if it is stored intact; `False` if it is missing or corrupt
        (its bytes no longer hash to its digest: logged), so that its bytes are put again.

        PostgreSQL hashes the stored bytes itself (`sha256()`), in the same statement; on SQLite, a
        local file, they are read and hashed here.
        """
        now = media_now()
        if self._db.dialect_name == 'postgresql':
            intact = func.encode(func.sha256(media.c.data), 'hex') == media.c.digest
            touched = update(media).where(media.c.digest == digest, intact).values(touched_at=now)
            if transaction.execute(touched).rowcount:
                return True
            found = transaction.execute(select(media.c.digest).where(media.c.digest == digest)).first() is not None
        else:
            row = transaction.execute(select(media.c.data).where(media.c.digest == digest)).first()
            found = row is not None
            if found and _hashes_to(row[0], digest):
                transaction.execute(update(media).where(media.c.digest == digest).values(touched_at=now))
                return True
        if found:
            logger.warning('blob media+sha256://%s is corrupt: its stored bytes will be written again', digest)
        return False

    async def touch(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        """`True` if the blob is stored intact (its touched time refreshed); `False` if it is missing or its
        stored bytes are corrupt, so that a caller reusing it puts it again (which repairs the row)."""
        require_text('uri', uri)
        digest = parse_media_uri(uri)
        await self._ready()
        return await self._db.run(lambda transaction: self._touch(transaction, digest), write=True)

    async def list_blobs(self) -> AsyncIterator[StoredBlob]:
        """Every blob row; one whose digest or touched time cannot be read is logged and left out (so
        collection never deletes it). None in a database without the tables (nothing is created)."""
        if not await self._ready_to_read():
            return
        rows = await self._db.run(partial(fetch, statement=_BLOBS), write=False)
        for row in read_each(rows, _blob_name, _stored_blob):
            yield row

    async def delete_blob(self, blob: StoredBlob, *, touched_before: datetime | None = None) -> bool:
        """Delete the row; with `touched_before`, in the same statement that checks its touched time."""
        require_text('blob.key', blob.key)
        statement = delete(media).where(media.c.digest == blob.key)
        if touched_before is not None:
            statement = statement.where(func.coalesce(media.c.touched_at, media.c.created_at) < touched_before)
        await self._ready()
        return await self._db.run(lambda transaction: bool(transaction.execute(statement).rowcount), write=True)

    async def _column(self, uri: str, column: str) -> Any:
        """The blob's value in `column` (`Unreadable` if it cannot be decoded); `FileNotFoundError` if there
        is no such blob (also in a database without the tables, where nothing is created)."""
        require_text('uri', uri)
        statement = select(_READABLE[column]).where(media.c.digest == parse_media_uri(uri))
        ready = await self._ready_to_read()
        found = await self._db.run(partial(fetch, statement=statement), write=False) if ready else []
        row = found[0] if found else None
        if row is None:
            raise FileNotFoundError(f'blob {uri} is not in the media table of {self._db.description}')
        return row[0]

    async def get(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bytes:
        data = await self._column(uri, 'data')
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f'blob {uri} is corrupt: its row holds {type(data).__name__}, not bytes')
        return check_digest(uri, bytes(data))

    async def exists(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        try:
            await self._column(uri, 'digest')
        except FileNotFoundError:
            return False
        return True

    async def public_url(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str | None:
        require_text('uri', uri)
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Mapping[str, str]:
        metadata = await self._column(uri, 'metadata')
        if isinstance(metadata, Unreadable):
            raise ValueError(f'metadata of blob {uri} is unreadable: {metadata.error!r}')
        if not isinstance(metadata, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
        ):
            raise ValueError(f'metadata of blob {uri} is malformed')
        return metadata
