"""Where a SQL store's operations run, what it owns, and who commits.

A `Database` wraps one of:

- an engine the store created from a URL (owned: disposed by `aclose`);
- an application's `AsyncEngine` (borrowed: never disposed);
- an application's `AsyncConnection` (borrowed: statements run inside the caller's transaction,
  which the store never commits, rolls back or closes);
- an application's `AsyncSession` (borrowed: each operation runs on `await session.connection()`,
  inside the session's current transaction, which the session begins if none is open; the store
  never commits, rolls back or closes it);
- an application's `sqlite3.Connection` (borrowed: the store runs it on a worker thread and
  commits each of its own operations; closing the store never closes the connection);
- an application's `asyncpg.Pool` or `asyncpg.Connection` (borrowed, through an engine of the
  store's over it, `borrowed_asyncpg.py`: a pool's connections are acquired per operation and
  released; a connection is never closed, and inside the caller's transaction each operation is
  a savepoint of it).

Each operation is one synchronous function run in one transaction on one connection (see
`executors.py`): SQLite engines the store builds run the whole transaction in one worker-thread
call, starting writes with `BEGIN IMMEDIATE` (a writer waits for the lock, up to the busy
timeout, instead of failing halfway) and reads with `BEGIN` (one consistent view per read);
PostgreSQL and an application's engine, connection or session run it through `AsyncConnection.run_sync`.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, UnboundExecutionError

from step_persistence.stores.sql.dialects import check_dialect, redact, resolve_url
from step_persistence.stores.sql.engines import (
    SqliteSynchronous,
    check_synchronous,
    postgres_engine,
    sqlite3_engine,
    sqlite_engine,
)
from step_persistence.stores.sql.executors import (
    AsyncBind,
    AsyncExecutor,
    Executor,
    Operation,
    ThreadExecutor,
    is_async_bind,
)
from step_persistence.stores.sql.naming import TableNames, table_names
from step_persistence.stores.sql.prepared import Prepared

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

__all__ = [
    'DEFAULT_BUSY_TIMEOUT',
    'SQLITE_THREADS',
    'Database',
    'DatabaseTarget',
    'SqliteSynchronous',
    'SqliteTarget',
    'is_data_exception',
]

Borrowed: TypeAlias = AsyncBind
"""An application's engine, connection or session, which a store uses and never closes."""

DatabaseTarget: TypeAlias = (
    'str | URL | AsyncEngine | AsyncConnection | AsyncSession | asyncpg.Pool | asyncpg.Connection'
)
"""What a SQL store is opened on: a URL (the store owns its engine), an application's engine, connection
or session, or (PostgreSQL) an application's asyncpg pool or connection."""

SqliteTarget: TypeAlias = 'str | os.PathLike[str] | AsyncEngine | AsyncConnection | AsyncSession | None'
"""What a SQLite front door is opened on besides a `sqlite3.Connection`: a path (`None`: `runs.db`),
`':memory:'`, or an application's SQLite engine, connection or session (see `Database.for_sqlite`)."""

DEFAULT_BUSY_TIMEOUT = 30.0
"""Seconds a SQLite writer waits for another connection's write lock before failing."""

SQLITE_THREADS = 4
"""Worker threads (and pooled connections) of a SQLite file the store opens: one writer, readers beside it."""

T = TypeVar('T')

_NUL_SQLSTATES = frozenset({'22021', '22P05'})
"""PostgreSQL's refusals of a NUL character: in a text value (22021), in a JSON string (22P05)."""

_PSYCOPG_NUL = 'cannot contain NUL'
"""How psycopg 3 refuses a NUL character in a text value before sending it (a `DataError` without SQLSTATE)."""

_OUT_OF_RANGE_SQLSTATE = '22003'
"""PostgreSQL's refusal of a number outside its column's type (`numeric_value_out_of_range`)."""


def _sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of the driver error behind `error`, if any."""
    cause: BaseException | None = error
    while cause is not None:
        sqlstate = getattr(cause, 'sqlstate', None)
        if isinstance(sqlstate, str):
            return sqlstate
        cause = getattr(cause, 'orig', None) if isinstance(cause, DBAPIError) else cause.__cause__
    return None


def is_data_exception(error: BaseException) -> bool:
    """Whether `error` is the database refusing a value (SQLSTATE class 22, data exception: out of range,
    invalid format, an infinite timestamp in arithmetic...)."""
    sqlstate = _sqlstate(error)
    return sqlstate is not None and sqlstate.startswith('22')


class Database:
    """One SQL database as a store sees it: operations in transactions, and only its own things closed."""

    def __init__(
        self,
        executor: Executor,
        *,
        dialect_name: str,
        owns_engine: bool,
        in_caller_transaction: bool = False,
        schema: str | None = None,
        table_prefix: str = '',
        description: str,
    ) -> None:
        if schema is not None and dialect_name != 'postgresql':
            raise ValueError(f'a schema name is only supported on PostgreSQL, not {dialect_name}')
        self.dialect_name = dialect_name
        self.schema = schema
        self.names: TableNames = table_names(table_prefix)
        """The names of the store's tables, views, indexes and version table here (`table_prefix` before each)."""
        self.description = description
        self.in_caller_transaction = in_caller_transaction
        """Whether operations run in a transaction the caller controls (an `AsyncConnection`, an
        `AsyncSession` or an asyncpg connection was given)."""
        self.migrated = False
        """Whether this process brought the tables to the newest revision, or found them there before a read;
        the stores sharing this database (a step store and its media store) share it (see `DatabaseStore`)."""
        self._migration_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop of the latest operation (`_follow_loop`)."""
        self.sqlite_file: Path | None = None
        """The SQLite file of an engine built from a path or URL: created, with its directory, by the first
        migration (`migrate.upgrade`), never by a read (see `DatabaseStore`)."""
        self._options: Mapping[str, Any] = {} if schema is None else {'schema_translate_map': {None: schema}}
        self._executor = executor
        self._owns_engine = owns_engine

    @property
    def migration_lock(self) -> asyncio.Lock:
        """Held while one of those stores migrates, so that concurrent first operations wait for one migration."""
        self._follow_loop()
        return self._migration_lock

    def _follow_loop(self) -> None:
        """Let the database serve the running event loop: a store may be used from one loop, then another (an
        application's `run_sync` and `asyncio.run` in turn), never from two at once. What belongs to a loop
        (locks; the connections of an engine the store built, which asyncpg binds to their loop) is made
        afresh on a new one."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._loop is not None:
            self._migration_lock = asyncio.Lock()
            self._executor.follow_loop()
        self._loop = loop

    def keep_media_in(self, table: str) -> None:
        """Name the media table `table`: a media store's blob table of its own (before its first operation)."""
        self.names = table_names(self.names.prefix, media_table=table)

    @classmethod
    def open(cls, target: DatabaseTarget, *, schema: str | None, table_prefix: str = '') -> Database:
        """The database a store is built on: from a URL (owned), an engine, a connection, a session or an asyncpg
        pool or connection (borrowed)."""
        if is_async_bind(target):
            return cls.borrowing(target, schema=schema, table_prefix=table_prefix)
        if isinstance(target, str | URL):
            return cls.from_url(target, schema=schema, table_prefix=table_prefix)
        if _is_asyncpg_target(target):
            return cls.from_asyncpg(target, schema=schema, table_prefix=table_prefix)
        raise TypeError(
            f'expected a database URL, an AsyncEngine, an AsyncConnection, an AsyncSession, or an asyncpg pool '
            f'or connection, got {type(target).__name__}'
        )

    @classmethod
    def from_url(
        cls,
        url: str | URL,
        *,
        schema: str | None = None,
        table_prefix: str = '',
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: SqliteSynchronous = 'NORMAL',
    ) -> Database:
        """An owned engine for `url` (`sqlite://...` or `postgresql://...`).

        SQLite runs on Python's `sqlite3` module in the store's worker threads; PostgreSQL on asyncpg.
        """
        resolved = resolve_url(url)
        description = f'URL {redact(resolved)}'
        if resolved.get_backend_name() == 'postgresql':
            executor: Executor = AsyncExecutor(postgres_engine(resolved), direct=True)
        else:
            engine = sqlite_engine(
                resolved.database or ':memory:',
                busy_timeout=busy_timeout,
                synchronous=check_synchronous(synchronous),
                pool_size=SQLITE_THREADS + 1,
            )
            executor = ThreadExecutor(engine, threads=SQLITE_THREADS)
        database = cls(
            executor,
            dialect_name=resolved.get_backend_name(),
            owns_engine=True,
            schema=schema,
            table_prefix=table_prefix,
            description=description,
        )
        if resolved.get_backend_name() == 'sqlite' and resolved.database not in (None, '', ':memory:'):
            database.sqlite_file = Path(resolved.database)
        return database

    @classmethod
    def for_sqlite(
        cls,
        database: SqliteTarget,
        *,
        connection: sqlite3.Connection | None,
        busy_timeout: float,
        synchronous: SqliteSynchronous = 'NORMAL',
        table_prefix: str = '',
        owner: str,
    ) -> Database:
        """The database of a SQLite front door (`owner` names it in errors).

        `database` is a file path (created with its directory by the first migration, not here;
        `None` means `runs.db`),
        `':memory:'`, or an application's SQLite `AsyncEngine`, `AsyncConnection` or `AsyncSession`; or
        `connection` is an application's `sqlite3.Connection` (see `from_sqlite3`).
        """
        if connection is not None:
            if database is not None:
                raise TypeError('pass either database= or connection=, not both')
            if not isinstance(connection, sqlite3.Connection):
                raise TypeError(f'connection= must be a sqlite3.Connection, got {type(connection).__name__}')
            return cls.from_sqlite3(connection, table_prefix=table_prefix)
        if is_async_bind(database):
            dialect_name = _sync_bind(database).dialect.name
            if dialect_name != 'sqlite':
                raise ValueError(f'{owner} needs a SQLite engine, connection or session, got {dialect_name}')
            return cls.borrowing(database, schema=None, table_prefix=table_prefix)
        name = os.fspath('runs.db' if database is None else database)
        return cls.from_url(
            URL.create('sqlite+aiosqlite', database=name),
            table_prefix=table_prefix,
            busy_timeout=busy_timeout,
            synchronous=synchronous,
        )

    @classmethod
    def for_postgres(
        cls, url_or_engine: DatabaseTarget, *, schema: str | None, table_prefix: str = '', owner: str
    ) -> Database:
        """The database of a PostgreSQL front door (`owner` names it in errors): a URL, engine, connection,
        session, or asyncpg pool or connection."""
        if _is_asyncpg_target(url_or_engine):
            return cls.from_asyncpg(url_or_engine, schema=schema, table_prefix=table_prefix)
        if is_async_bind(url_or_engine):
            dialect_name = _sync_bind(url_or_engine).dialect.name
            if dialect_name != 'postgresql':
                raise ValueError(f'{owner} needs a PostgreSQL database, got a {dialect_name} engine')
            return cls.borrowing(url_or_engine, schema=schema, table_prefix=table_prefix)
        url = resolve_url(url_or_engine)
        if url.get_backend_name() != 'postgresql':
            raise ValueError(f'{owner} needs a PostgreSQL database, got {redact(url)}')
        return cls.from_url(url, schema=schema, table_prefix=table_prefix)

    @classmethod
    def borrowing(cls, bind: Borrowed, *, schema: str | None = None, table_prefix: str = '') -> Database:
        """An application's engine (used as configured, never disposed), connection (statements join its
        transaction; nothing is committed, rolled back or closed) or session (statements run on its
        connection, in its current transaction, which the store never commits, rolls back or closes).

        The drivers accepted are `SHARED_DRIVERS` (aiosqlite; asyncpg or psycopg 3), whose statements all
        run through Core."""
        from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession  # loaded: the bind is one of them

        sync_bind = _sync_bind(bind)
        dialect = sync_bind.dialect
        is_engine = isinstance(bind, AsyncEngine)
        url = redact(sync_bind.engine.url)
        if is_engine:
            description = f'engine {url}'
        elif isinstance(bind, AsyncSession):
            description = f'session on {url}'
        else:
            description = f'connection to {url}'
        check_dialect(dialect.name, dialect.driver, where=description, shared=True)
        return cls(
            AsyncExecutor(bind),
            dialect_name=dialect.name,
            owns_engine=False,
            in_caller_transaction=not is_engine,
            schema=schema,
            table_prefix=table_prefix,
            description=description,
        )

    @classmethod
    def from_asyncpg(cls, target: Any, *, schema: str | None = None, table_prefix: str = '') -> Database:
        """An application's `asyncpg.Pool` or `asyncpg.Connection`, through an engine the store builds over it.

        A pool lends a connection per operation, given back when it ends; each operation commits, as
        on an engine. A connection is the store's only one: outside a transaction each operation
        commits; inside the caller's (`connection.is_in_transaction()`) it is a savepoint of it, so
        the caller's commit or rollback decides, and no run's head is cached; an operation runs to its
        end even if its caller is cancelled. Closing the store closes neither; their type codecs are
        left as they are (see `borrowed_asyncpg.py`).
        """
        from step_persistence.stores.sql.borrowed_asyncpg import (
            UninterruptibleExecutor,
            asyncpg_engine,
            describe,
            is_pool,
        )

        executor: Executor = AsyncExecutor(asyncpg_engine(target))
        if not is_pool(target):
            executor = UninterruptibleExecutor(executor)
        return cls(
            executor,
            dialect_name='postgresql',
            owns_engine=True,
            in_caller_transaction=not is_pool(target),
            schema=schema,
            table_prefix=table_prefix,
            description=describe(target),
        )

    @classmethod
    def from_sqlite3(cls, connection: sqlite3.Connection, *, table_prefix: str = '') -> Database:
        """An application's `sqlite3.Connection` (opened with `check_same_thread=False`).

        The store drives it from a worker thread, commits each operation it makes, and never
        closes it. Its pragmas (journal mode, busy timeout, foreign keys) are left as the caller
        set them.
        """
        return cls(
            ThreadExecutor(sqlite3_engine(connection), threads=1),
            dialect_name='sqlite',
            owns_engine=True,
            table_prefix=table_prefix,
            description='a sqlite3 connection',
        )

    async def run(self, operation: Operation[T], *, write: bool, one_statement: bool = False) -> T:
        """Run `operation` in one transaction, committed if it returns (SQLite writes: `BEGIN IMMEDIATE`).

        With a caller's `AsyncConnection`, in the caller's transaction, neither committed nor
        rolled back here. `one_statement`: the operation executes a single statement, which on an
        engine may run in autocommit (see `executors.py`).
        """
        self._follow_loop()
        try:
            return await self._executor.run(
                operation, write=write, options=self._options, names=self.names, one_statement=one_statement
            )
        except DBAPIError as error:
            refusal = self._refusal(error)
            if refusal is None:
                raise
            raise refusal from error

    async def run_statement(self, statement: Prepared, parameters: Mapping[str, Any], *, autocommit: bool) -> Any:
        """The first row of `statement`, a single write atomic by itself, as an operation of its own: with
        `autocommit` (the store owns the transaction), its own transaction without `BEGIN` or `COMMIT` (on the
        store's own PostgreSQL engine, straight on the driver: `executors.py`); else in the caller's."""
        self._follow_loop()
        try:
            return await self._executor.run_statement(
                statement, parameters, options=self._options, names=self.names, autocommit=autocommit
            )
        except DBAPIError as error:
            refusal = self._refusal(error)
            if refusal is None:
                raise
            raise refusal from error

    def _refusal(self, error: DBAPIError) -> ValueError | None:
        """The `ValueError` a failed operation raises for a value PostgreSQL cannot store (`None`: raise `error`)."""
        if self.dialect_name != 'postgresql':
            return None
        sqlstate = _sqlstate(error)
        if sqlstate in _NUL_SQLSTATES or (sqlstate is None and _PSYCOPG_NUL in str(error.orig)):
            return ValueError(
                f'PostgreSQL cannot store the NUL character (\\x00) in text or JSON; nothing was written ({error.orig})'
            )
        if sqlstate == _OUT_OF_RANGE_SQLSTATE:
            return ValueError(f"a number is out of its column's range; nothing was written ({error.orig})")
        return None

    async def aclose(self) -> None:
        """Dispose of the engine if this database created it; borrowed engines, connections and sessions stay
        open."""
        if self._owns_engine:
            await self._executor.dispose()


def _is_asyncpg_target(value: object) -> bool:
    """Whether `value` is an `asyncpg.Pool` or an `asyncpg.Connection` (one acquired from a pool included).

    Neither exists before asyncpg is imported, so it is looked up rather than imported: a store on a URL
    or an engine never loads asyncpg for this check.
    """
    asyncpg = sys.modules.get('asyncpg')
    return asyncpg is not None and isinstance(value, asyncpg.Pool | asyncpg.Connection)


def _sync_bind(bind: Borrowed) -> Engine | Connection:
    """The synchronous engine or connection under an application's engine, connection or session.

    A session's is what `session.connection()` would use (its `bind`), found without beginning a
    transaction; a session bound to nothing, or only per mapper or table, is a `ValueError`.
    """
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine  # loaded: the bind is one of them

    if isinstance(bind, AsyncEngine):
        return bind.sync_engine
    if isinstance(bind, AsyncConnection):
        return bind.sync_engine  # its dialect and URL; a connection not started yet has no sync_connection
    try:
        return bind.sync_session.get_bind()
    except UnboundExecutionError as error:
        raise ValueError(
            'this AsyncSession has no default bind (an engine or connection): create it with bind=..., '
            'or pass the store `await session.connection(bind_arguments=...)` for the database it should use'
        ) from error
