"""Where a SQL store's statements run, what it owns, and who commits.

A `Database` wraps one of:

- an engine the store created from a URL (owned: disposed by `aclose`);
- an application's `AsyncEngine` (borrowed: never disposed);
- an application's `AsyncConnection` (borrowed: statements run inside the caller's transaction,
  which the store never commits, rolls back or closes);
- an application's `sqlite3.Connection` (borrowed: the store runs it on a worker thread and
  commits each of its own operations; closing the store never closes the connection).

Each operation runs in one transaction on one connection. On SQLite engines the store builds,
the store emits `BEGIN IMMEDIATE` for writes (so a writer waits for the lock, up to the busy
timeout, instead of failing halfway) and `BEGIN` for reads (one consistent view per read).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiosqlite
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from step_persistence.stores.sql.dialects import check_dialect, redact, resolve_url

__all__ = ['DEFAULT_BUSY_TIMEOUT', 'Database']

DEFAULT_BUSY_TIMEOUT = 30.0
"""Seconds a SQLite writer waits for another connection's write lock before failing."""

_WRITE = 'step_persistence_write'
"""Connection execution option: the transaction about to begin writes (SQLite: `BEGIN IMMEDIATE`)."""


class Database:
    """One SQL database as a store sees it: transactions on demand, and only its own things closed."""

    def __init__(
        self,
        *,
        engine: AsyncEngine | None = None,
        connection: AsyncConnection | None = None,
        owns_engine: bool = False,
        schema: str | None = None,
        description: str,
    ) -> None:
        bind = engine if engine is not None else connection
        if bind is None or (engine is not None and connection is not None):
            raise TypeError('pass exactly one of engine= or connection=')
        dialect = bind.dialect
        check_dialect(dialect.name, dialect.driver, where=description)
        if schema is not None and dialect.name != 'postgresql':
            raise ValueError(f'a schema name is only supported on PostgreSQL, not {dialect.name}')
        self.dialect_name: str = dialect.name
        self.schema = schema
        self.description = description
        self.execution_options: Mapping[str, Any] = {} if schema is None else {'schema_translate_map': {None: schema}}
        """Options for every statement: maps the schema-less tables into `schema`."""
        self._engine = engine
        self._connection = connection
        self._owns_engine = owns_engine
        single_connection = connection is not None or isinstance(getattr(engine, 'pool', None), StaticPool)
        self._serial = asyncio.Lock() if single_connection else None
        """Held for every operation when there is only one connection to share."""
        self._writer = asyncio.Lock() if dialect.name == 'sqlite' and not single_connection else None
        """SQLite admits one writer at a time: this process's writers queue here rather than in the busy handler."""

    @property
    def in_caller_transaction(self) -> bool:
        """Whether statements run in a transaction the caller controls (an `AsyncConnection` was given)."""
        return self._connection is not None

    @classmethod
    def from_url(
        cls, url: str | URL, *, schema: str | None = None, busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    ) -> Database:
        """An owned engine for `url` (`sqlite://...` or `postgresql://...`; the async driver is filled in)."""
        resolved = resolve_url(url)
        if resolved.get_backend_name() == 'postgresql':
            engine = create_async_engine(resolved, pool_pre_ping=True)
        else:
            engine = create_async_engine(resolved, connect_args={'timeout': busy_timeout})
            file_backed = resolved.database not in (None, '', ':memory:')
            _take_over_sqlite_transactions(engine, wal=file_backed)
        return cls(engine=engine, owns_engine=True, schema=schema, description=f'URL {redact(resolved)}')

    @classmethod
    def from_engine(cls, engine: AsyncEngine, *, schema: str | None = None) -> Database:
        """An application's engine: used as configured, never disposed."""
        return cls(engine=engine, schema=schema, description=f'engine {redact(engine.url)}')

    @classmethod
    def from_connection(cls, connection: AsyncConnection, *, schema: str | None = None) -> Database:
        """An application's connection: statements join its transaction; nothing is committed or closed."""
        return cls(connection=connection, schema=schema, description=f'connection to {redact(connection.engine.url)}')

    @classmethod
    def from_sqlite3(cls, connection: sqlite3.Connection) -> Database:
        """An application's `sqlite3.Connection` (opened with `check_same_thread=False`).

        The store drives it from a worker thread, commits each write operation it makes, and
        never closes it. Its pragmas (journal mode, busy timeout, foreign keys) are left as the
        caller set them.
        """
        borrowed = _BorrowedSqlite3(connection)

        async def connect() -> aiosqlite.Connection:
            driver = aiosqlite.Connection(lambda: borrowed, iter_chunk_size=64)  # type: ignore[arg-type, return-value]
            # As SQLAlchemy does for the connections it opens: a forgotten store must not keep
            # the interpreter alive at exit.
            driver._thread.daemon = True
            return await driver

        engine = create_async_engine('sqlite+aiosqlite://', async_creator=connect, poolclass=StaticPool)
        _begin_explicitly(engine)
        return cls(engine=engine, owns_engine=True, description='a sqlite3 connection')

    @contextlib.asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[AsyncConnection]:
        """A connection inside a transaction for one operation, committed on success.

        With a caller's `AsyncConnection`, that connection as it is: the caller's transaction,
        neither committed nor rolled back here.
        """
        writer = self._writer if write else None
        async with self._serial or contextlib.nullcontext(), writer or contextlib.nullcontext():
            if self._connection is not None:
                yield self._connection
                return
            assert self._engine is not None
            async with self._engine.connect() as connection:
                if write:
                    await connection.execution_options(**{_WRITE: True})
                async with connection.begin():
                    yield connection

    async def aclose(self) -> None:
        """Dispose of the engine if this database created it; borrowed engines and connections stay open."""
        if self._owns_engine and self._engine is not None:
            await self._engine.dispose()


def _take_over_sqlite_transactions(engine: AsyncEngine, *, wal: bool) -> None:
    """Configure each new connection of an engine the store owns, and let the store emit BEGIN."""

    @event.listens_for(engine.sync_engine, 'connect')
    def configure(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute('PRAGMA foreign_keys = ON')
        if wal:
            cursor.execute('PRAGMA journal_mode = WAL')
        cursor.close()

    _begin_explicitly(engine)


def _begin_explicitly(engine: AsyncEngine) -> None:
    """Emit `BEGIN IMMEDIATE` (writes) or `BEGIN` (reads) unless the driver is already in a transaction."""

    @event.listens_for(engine.sync_engine, 'begin')
    def begin(connection: Connection) -> None:
        if connection.connection.driver_connection.in_transaction:  # type: ignore[union-attr]
            return
        write = bool(connection.get_execution_options().get(_WRITE))
        connection.exec_driver_sql('BEGIN IMMEDIATE' if write else 'BEGIN')


class _BorrowedSqlite3:
    """A caller's `sqlite3.Connection` as the store's driver sees it: `close()` leaves it open."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        object.__setattr__(self, '_connection', connection)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)

    def close(self) -> None:
        """Do nothing: the caller closes its own connection."""
