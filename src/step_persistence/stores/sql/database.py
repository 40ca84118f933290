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

An operation that starts inside another operation's transaction on the same `Database` (the
SQL media store putting a blob while the step store saves a snapshot) joins that transaction:
same connection, committed or rolled back together. Several tasks joining one transaction (the
media walker puts blobs concurrently) take turns on its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiosqlite
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool
from sqlalchemy.sql import Executable

from step_persistence.stores.sql.dialects import check_dialect, redact, resolve_url

__all__ = ['DEFAULT_BUSY_TIMEOUT', 'Database', 'SqliteSynchronous']

DEFAULT_BUSY_TIMEOUT = 30.0
"""Seconds a SQLite writer waits for another connection's write lock before failing."""

SqliteSynchronous = Literal['NORMAL', 'FULL']
"""SQLite's `synchronous` setting for the files a store opens (in WAL mode).

`NORMAL` (the default): a committed write survives the crash or kill of any process, because it
is in the WAL file the moment the commit returns; an operating-system crash or power loss may
undo the last commits (the database stays consistent). `FULL`: every commit is also fsynced, so
it survives power loss too, at the cost of a disk flush per commit.
"""

_WRITE = 'step_persistence_write'
"""Connection execution option: the transaction about to begin writes (SQLite: `BEGIN IMMEDIATE`)."""


@dataclass(frozen=True)
class _Current:
    """The transaction an operation on `database` is running in, for operations nested inside it."""

    database: Database
    connection: AsyncConnection
    turn: asyncio.Lock
    """Held by each nested operation while it uses the connection."""


_CURRENT: ContextVar[_Current | None] = ContextVar('step_persistence_sql_transaction', default=None)


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
        self._schema_ready = False
        self._schema_lock = asyncio.Lock()

    @classmethod
    def open(cls, target: str | URL | AsyncEngine | AsyncConnection | Database, *, schema: str | None) -> Database:
        """The database a store is built on: from a URL (owned), an engine or a connection (borrowed).

        A `Database` is returned as it is (the schema belongs to it already).
        """
        if isinstance(target, Database):
            if schema is not None:
                raise TypeError('pass the schema to the Database, not to the store')
            return target
        if isinstance(target, AsyncEngine):
            return cls.from_engine(target, schema=schema)
        if isinstance(target, AsyncConnection):
            return cls.from_connection(target, schema=schema)
        if isinstance(target, str | URL):
            return cls.from_url(target, schema=schema)
        raise TypeError(f'expected a database URL, an AsyncEngine or an AsyncConnection, got {type(target).__name__}')

    @property
    def in_caller_transaction(self) -> bool:
        """Whether statements run in a transaction the caller controls (an `AsyncConnection` was given)."""
        return self._connection is not None

    @classmethod
    def from_url(
        cls,
        url: str | URL,
        *,
        schema: str | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: SqliteSynchronous = 'NORMAL',
    ) -> Database:
        """An owned engine for `url` (`sqlite://...` or `postgresql://...`; the async driver is filled in)."""
        resolved = resolve_url(url)
        if resolved.get_backend_name() == 'postgresql':
            engine = create_async_engine(resolved, pool_pre_ping=True)
        else:
            engine = create_async_engine(resolved, connect_args={'timeout': busy_timeout})
            file_backed = resolved.database not in (None, '', ':memory:')
            _take_over_sqlite_transactions(engine, wal=file_backed, synchronous=_check_synchronous(synchronous))
        return cls(engine=engine, owns_engine=True, schema=schema, description=f'URL {redact(resolved)}')

    @classmethod
    def for_sqlite(
        cls,
        database: str | os.PathLike[str] | AsyncEngine | AsyncConnection | None,
        *,
        connection: sqlite3.Connection | None,
        busy_timeout: float,
        synchronous: SqliteSynchronous = 'NORMAL',
        owner: str,
    ) -> Database:
        """The database of a SQLite front door (`owner` names it in errors).

        `database` is a file path (created with its directory; `None` means `runs.db`),
        `':memory:'`, or an application's SQLite `AsyncEngine` or `AsyncConnection`; or
        `connection` is an application's `sqlite3.Connection` (see `from_sqlite3`).
        """
        if connection is not None:
            if database is not None:
                raise TypeError('pass either database= or connection=, not both')
            if not isinstance(connection, sqlite3.Connection):
                raise TypeError(f'connection= must be a sqlite3.Connection, got {type(connection).__name__}')
            return cls.from_sqlite3(connection)
        if isinstance(database, AsyncEngine | AsyncConnection):
            if database.dialect.name != 'sqlite':
                raise ValueError(f'{owner} needs a SQLite engine or connection, got {database.dialect.name}')
            return cls.open(database, schema=None)
        name = os.fspath('runs.db' if database is None else database)
        if name != ':memory:':
            Path(name).parent.mkdir(parents=True, exist_ok=True)
        return cls.from_url(
            URL.create('sqlite+aiosqlite', database=name), busy_timeout=busy_timeout, synchronous=synchronous
        )

    @classmethod
    def for_postgres(
        cls, url_or_engine: str | URL | AsyncEngine | AsyncConnection, *, schema: str | None, owner: str
    ) -> Database:
        """The database of a PostgreSQL front door (`owner` names it in errors): a URL, engine or connection."""
        if isinstance(url_or_engine, AsyncEngine | AsyncConnection):
            if url_or_engine.dialect.name != 'postgresql':
                raise ValueError(f'{owner} needs a PostgreSQL database, got a {url_or_engine.dialect.name} engine')
            return cls.open(url_or_engine, schema=schema)
        url = resolve_url(url_or_engine)
        if url.get_backend_name() != 'postgresql':
            raise ValueError(f'{owner} needs a PostgreSQL database, got {redact(url)}')
        return cls.from_url(url, schema=schema)

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
        neither committed nor rolled back here. Inside another operation's transaction on this
        database, that transaction (see the module docstring).
        """
        current = _CURRENT.get()
        if current is not None and current.database is self:
            async with current.turn:
                yield current.connection
            return
        writer = self._writer if write else None
        async with self._serial or contextlib.nullcontext(), writer or contextlib.nullcontext():
            if self._connection is not None:
                with self._current(self._connection):
                    yield self._connection
                return
            assert self._engine is not None
            async with self._engine.connect() as connection:
                if write:
                    await connection.execution_options(**{_WRITE: True})
                async with connection.begin():
                    with self._current(connection):
                        yield connection

    async def execute(self, connection: AsyncConnection, statement: Executable, parameters: Any = None) -> Any:
        """Run `statement` on `connection` (one of this database's) with the schema mapping applied."""
        return await connection.execute(statement, parameters, execution_options=self.execution_options)

    @contextlib.contextmanager
    def _current(self, connection: AsyncConnection) -> Iterator[None]:
        token = _CURRENT.set(_Current(database=self, connection=connection, turn=asyncio.Lock()))
        try:
            yield
        finally:
            _CURRENT.reset(token)

    async def ensure_schema(self, upgrade: Callable[[Database], Awaitable[None]]) -> None:
        """Run `upgrade` unless the schema is known to be up to date; concurrent callers wait for one run.

        Stores sharing this database (a step store and its media store) share this knowledge.
        """
        if self._schema_ready:
            return
        async with self._schema_lock:
            if not self._schema_ready:
                await upgrade(self)
                self._schema_ready = True

    def schema_upgraded(self) -> None:
        """Record that the schema was just brought up to date (by an explicit migration)."""
        self._schema_ready = True

    async def aclose(self) -> None:
        """Dispose of the engine if this database created it; borrowed engines and connections stay open."""
        if self._owns_engine and self._engine is not None:
            await self._engine.dispose()


def _check_synchronous(synchronous: str) -> SqliteSynchronous:
    if synchronous not in ('NORMAL', 'FULL'):
        raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
    return synchronous  # type: ignore[return-value]


def _take_over_sqlite_transactions(engine: AsyncEngine, *, wal: bool, synchronous: SqliteSynchronous) -> None:
    """Configure each new connection of an engine the store owns, and let the store emit BEGIN."""

    @event.listens_for(engine.sync_engine, 'connect')
    def configure(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute('PRAGMA foreign_keys = ON')
        if wal:
            cursor.execute('PRAGMA journal_mode = WAL')
            cursor.execute(f'PRAGMA synchronous = {synchronous}')
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
