"""The engines a SQL store builds for itself: SQLite (a file, `:memory:`, a caller's `sqlite3` connection)
and PostgreSQL.

SQLite engines are synchronous (Python's `sqlite3` module): the store runs each whole operation
on one of its worker threads (see `executors.py`). Every connection of a SQLite engine the store
builds lets the store emit `BEGIN` itself, so a write transaction starts with `BEGIN IMMEDIATE`
(a writer takes the write lock before it reads anything it will write from) and a read with a
plain `BEGIN` (one consistent view per read).
"""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any, Literal

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool, StaticPool

__all__ = [
    'PING_AFTER_IDLE_SECONDS',
    'POSTGRES_TIMEOUTS',
    'WRITE_OPTION',
    'SqliteSynchronous',
    'check_synchronous',
    'postgres_engine',
    'sqlite3_engine',
    'sqlite_engine',
]

SqliteSynchronous = Literal['NORMAL', 'FULL']
"""SQLite's `synchronous` setting for the files a store opens (in WAL mode).

`NORMAL` (the default): a committed write survives the crash or kill of any process, because it
is in the WAL file the moment the commit returns; an operating-system crash or power loss may
undo the last commits (the database stays consistent). `FULL`: every commit is also fsynced, so
it survives power loss too, at the cost of a disk flush per commit.
"""

WRITE_OPTION = 'step_persistence_write'
"""Execution option of an engine or connection whose transactions write (SQLite: `BEGIN IMMEDIATE`)."""


def check_synchronous(synchronous: str) -> SqliteSynchronous:
    """`synchronous` if it is `'NORMAL'` or `'FULL'`; otherwise `ValueError`."""
    if synchronous not in ('NORMAL', 'FULL'):
        raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
    return synchronous  # type: ignore[return-value]


PING_AFTER_IDLE_SECONDS = 10.0
"""A pooled PostgreSQL connection idle longer than this is pinged before it is handed out again."""

_IDLE_SINCE = 'step_persistence_idle_since'


POSTGRES_TIMEOUTS = ('timeout', 'command_timeout')
"""Query parameters of a PostgreSQL URL, in seconds: connecting (asyncpg's default 60), and each statement
(asyncpg's default: none)."""


def postgres_engine(url: URL) -> AsyncEngine:
    """A pooled asyncpg engine that hands out only live connections, without a round trip on a busy one.

    A connection the server closed (a restart, `pg_terminate_backend`) is replaced at checkout: the
    driver already saw the socket close. One that sat idle for more than `PING_AFTER_IDLE_SECONDS`
    is pinged first, since a connection dropped without a word (a firewall's idle timeout) looks
    open until used. `pool_pre_ping` would add that round trip to every operation.

    The URL's `POSTGRES_TIMEOUTS` parameters become asyncpg's; `ValueError` if one is not a
    positive number of seconds.
    """
    timeouts = {name: _seconds(name, url.query[name]) for name in POSTGRES_TIMEOUTS if name in url.query}
    engine = create_async_engine(url.difference_update_query(POSTGRES_TIMEOUTS), connect_args=timeouts)
    event.listen(engine.sync_engine.pool, 'checkin', _note_idle_since)
    event.listen(engine.sync_engine.pool, 'checkout', _refuse_dead_connection)
    return engine


def _seconds(name: str, value: str | tuple[str, ...]) -> float:
    try:
        seconds = float(value) if isinstance(value, str) else math.nan
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(f'the URL parameter {name} must be a positive number of seconds, got {value!r}')
    return seconds


def _note_idle_since(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    record.info[_IDLE_SINCE] = time.monotonic()


def _refuse_dead_connection(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
    """Raise `DisconnectionError` (the pool then connects afresh) for a closed or unresponsive connection."""
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError('the server closed this pooled connection')
    idle_since = record.info.get(_IDLE_SINCE)
    if idle_since is not None and time.monotonic() - idle_since > PING_AFTER_IDLE_SECONDS:
        try:
            dbapi_connection.ping()
        except Exception as error:
            idle = time.monotonic() - idle_since
            raise DisconnectionError(f'a pooled connection idle for {idle:.0f} s did not answer') from error


def sqlite_engine(database: str, *, busy_timeout: float, synchronous: SqliteSynchronous, pool_size: int) -> Engine:
    """An engine on a SQLite file (WAL journal, foreign keys, `synchronous`), or on `':memory:'`.

    A file gets a pool of `pool_size` connections, shared by the store's writer and worker threads; an
    in-memory database is one connection (`StaticPool`), since each connection would be a
    database of its own.
    """
    url = URL.create('sqlite+pysqlite', database=database)
    connect_args = {'timeout': busy_timeout, 'check_same_thread': False}
    if database == ':memory:':
        engine = create_engine(url, connect_args=connect_args, poolclass=StaticPool)
    else:
        engine = create_engine(url, connect_args=connect_args, poolclass=QueuePool, pool_size=pool_size, max_overflow=0)
    wal = database != ':memory:'

    @event.listens_for(engine, 'connect')
    def configure(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute('PRAGMA foreign_keys = ON')
        if wal:
            cursor.execute('PRAGMA journal_mode = WAL')
            cursor.execute(f'PRAGMA synchronous = {synchronous}')
        cursor.close()

    _begin_explicitly(engine)
    return engine


def sqlite3_engine(connection: sqlite3.Connection) -> Engine:
    """An engine whose one connection is a caller's `sqlite3.Connection`, left as the caller configured it.

    The store commits each of its operations on it and never closes it.
    """
    borrowed = _BorrowedSqlite3(connection)
    engine = create_engine('sqlite+pysqlite://', creator=lambda: borrowed, poolclass=StaticPool)
    _begin_explicitly(engine)
    return engine


def _begin_explicitly(engine: Engine) -> None:
    """Emit `BEGIN IMMEDIATE` (writes) or `BEGIN` (reads) unless the driver is already in a transaction."""

    @event.listens_for(engine, 'begin')
    def begin(connection: Connection) -> None:
        driver: Any = connection.connection.driver_connection
        if driver.in_transaction:
            return
        write = bool(connection.get_execution_options().get(WRITE_OPTION))
        driver.execute('BEGIN IMMEDIATE' if write else 'BEGIN')


class _BorrowedSqlite3:
    """A caller's `sqlite3.Connection` as the store's engine sees it: `close()` leaves it open."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        object.__setattr__(self, '_connection', connection)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)

    def close(self) -> None:
        """Do nothing: the caller closes its own connection."""
