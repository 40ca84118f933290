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
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlencode

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool, StaticPool

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    'PING_AFTER_IDLE_SECONDS',
    'POOL_SIZE',
    'POSTGRES_PARAMETERS',
    'POSTGRES_TIMEOUTS',
    'SSL_MODES',
    'WRITE_OPTION',
    'SqliteSynchronous',
    'asyncpg_arguments',
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
(asyncpg's default: none). libpq's `connect_timeout` is taken as `timeout`."""

SSL_MODES = ('disable', 'allow', 'prefer', 'require', 'verify-ca', 'verify-full')
"""libpq's `sslmode` values (asyncpg's `ssl` takes the same names)."""

_SSL_FILES = ('sslrootcert', 'sslcert', 'sslkey', 'sslpassword', 'sslcrl')
"""libpq's TLS parameters that asyncpg reads only from a connection string (`dsn`), not as arguments."""

_SSL_PROTOCOLS = ('ssl_min_protocol_version', 'ssl_max_protocol_version')
_TLS_VERSIONS = ('TLSv1', 'TLSv1.1', 'TLSv1.2', 'TLSv1.3')

_TARGET_SESSION_ATTRS = ('any', 'primary', 'standby', 'prefer-standby', 'read-write', 'read-only')

_PASSED_ON = frozenset({'host', 'port', 'user', 'password', 'passfile', 'krbsrvname', 'gsslib'})
"""Parameters asyncpg (or SQLAlchemy's multi-host URLs) takes as they are."""

_COUNTS = ('prepared_statement_cache_size', 'statement_cache_size', 'max_cacheable_statement_size')
"""Parameters taken as whole numbers from 0 (`prepared_statement_cache_size=0` for PgBouncer)."""

POSTGRES_PARAMETERS = frozenset(
    {
        *POSTGRES_TIMEOUTS,
        'connect_timeout',
        'application_name',
        'sslmode',
        'ssl',
        *_SSL_FILES,
        *_SSL_PROTOCOLS,
        'target_session_attrs',
        'max_cached_statement_lifetime',
        *_PASSED_ON,
        *_COUNTS,
    }
)
"""The query parameters a PostgreSQL URL may carry (see docs/sql.md); any other is a `ValueError`."""


POOL_SIZE = 15
"""The connections a store's own PostgreSQL engine holds at most: SQLAlchemy's default cap (5 kept, 10 more
while busy), all of them kept once opened (opened on demand). With overflow connections, many concurrent
writers made the pool close connections at check-in and open new ones moments later, each paying its start,
the driver's type introspection and the statements' prepares again (benchmarks/RESULTS.md, issue 22)."""


def postgres_engine(url: URL) -> AsyncEngine:
    """A pooled asyncpg engine that hands out only live connections, without a round trip on a busy one.

    A connection the server closed (a restart, `pg_terminate_backend`) is replaced at checkout: the
    driver already saw the socket close. One that sat idle for more than `PING_AFTER_IDLE_SECONDS`
    is pinged first, since a connection dropped without a word (a firewall's idle timeout) looks
    open until used. `pool_pre_ping` would add that round trip to every operation.

    The URL's query parameters become asyncpg's arguments (`asyncpg_arguments`); `ValueError` for
    one that asyncpg does not take, or a value it would refuse when connecting.
    """
    from sqlalchemy.ext.asyncio import create_async_engine

    driver_url, connect_args = asyncpg_arguments(url)
    engine = create_async_engine(driver_url, connect_args=connect_args, pool_size=POOL_SIZE, max_overflow=0)
    event.listen(engine.sync_engine.pool, 'checkin', _note_idle_since)
    event.listen(engine.sync_engine.pool, 'checkout', _refuse_dead_connection)
    return engine


def asyncpg_arguments(url: URL) -> tuple[URL, dict[str, Any]]:
    """The URL to give SQLAlchemy and the `connect_args` for asyncpg, from a PostgreSQL URL's query.

    Written as libpq takes them, so a URL that works with `psql` works here:

    - `timeout` and `command_timeout` (asyncpg's, in seconds), and libpq's `connect_timeout` for
      `timeout`: positive numbers of seconds;
    - `sslmode` (or asyncpg's spelling, `ssl`): one of `SSL_MODES`; `sslrootcert`, `sslcert`,
      `sslkey`, `sslpassword`, `sslcrl`, `ssl_min_protocol_version` and `ssl_max_protocol_version`,
      which asyncpg reads from a connection string (handed to it as `dsn`, whose host and database
      the URL's own override);
    - `application_name`, sent to the server as a setting;
    - `target_session_attrs` and the statement cache sizes (whole numbers), checked;
    - `host`, `port`, `user`, `password`, `passfile`, `krbsrvname`, `gsslib`, as they are.

    Anything else (a misspelling, libpq's `options`, a parameter given twice) is a `ValueError`
    that names it, raised now rather than as a `TypeError` from asyncpg at the first connection.
    Values of parameters whose names suggest a secret are never shown.
    """
    query = url.query
    unknown = sorted(set(query) - POSTGRES_PARAMETERS)
    if unknown:
        hint = ''
        if 'schema' in unknown:
            hint = ' (pass the schema as schema=; from_spec and the command line read ?schema=)'
        raise ValueError(
            f'unsupported PostgreSQL URL parameter {", ".join(map(repr, unknown))}{hint}; supported: '
            f'{", ".join(sorted(POSTGRES_PARAMETERS))}'
        )
    values: dict[str, str] = {}
    for name, value in query.items():
        if isinstance(value, tuple) and name not in ('host', 'port'):
            raise ValueError(f'the URL parameter {name} is given {len(value)} times')
        if isinstance(value, str):
            values[name] = value
    if 'timeout' in values and 'connect_timeout' in values:
        raise ValueError('give the URL parameter timeout or connect_timeout, not both')
    if 'ssl' in values and 'sslmode' in values:
        raise ValueError('give the URL parameter sslmode or ssl, not both')
    connect_args: dict[str, Any] = {}
    for name in (*POSTGRES_TIMEOUTS, 'connect_timeout'):
        if name in values:
            connect_args['command_timeout' if name == 'command_timeout' else 'timeout'] = _seconds(name, values[name])
    dsn: dict[str, str] = {}
    for name in ('sslmode', 'ssl'):
        if name in values:
            dsn['sslmode'] = _one_of(name, values[name], SSL_MODES)
    for name in _SSL_FILES:
        if name in values:
            dsn[name] = values[name]
    for name in _SSL_PROTOCOLS:
        if name in values:
            dsn[name] = _one_of(name, values[name], _TLS_VERSIONS)
    if dsn:
        connect_args['dsn'] = 'postgresql://?' + urlencode(dsn)
    if 'application_name' in values:
        connect_args['server_settings'] = {'application_name': values['application_name']}
    if 'target_session_attrs' in values:
        _one_of('target_session_attrs', values['target_session_attrs'], _TARGET_SESSION_ATTRS)
        connect_args['target_session_attrs'] = values['target_session_attrs']
    for name in _COUNTS:
        if name in values:
            connect_args[name] = _count(name, values[name])
    if 'max_cached_statement_lifetime' in values:
        connect_args['max_cached_statement_lifetime'] = _count(
            'max_cached_statement_lifetime', values['max_cached_statement_lifetime']
        )
    handled = [name for name in query if name not in _PASSED_ON]
    return url.difference_update_query(handled), connect_args


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f'the URL parameter {name} must be one of {", ".join(allowed)}, got {value!r}')
    return value


def _count(name: str, value: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f'the URL parameter {name} must be a whole number from 0, got {value!r}')
    return int(value)


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


_WAL_PENDING = 'step_persistence.wal_pending'
"""Key of a pooled SQLite connection's `info`: its file is to be switched to WAL by its first write."""


def sqlite_engine(database: str, *, busy_timeout: float, synchronous: SqliteSynchronous, pool_size: int) -> Engine:
    """An engine on a SQLite file (WAL journal from the first write on, foreign keys, `synchronous`), or on
    `':memory:'`.

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
            # Switching to WAL writes the file's header: left to the first write transaction (reading never
            # writes), unless the file is in WAL mode already.
            record.info[_WAL_PENDING] = cursor.execute('PRAGMA journal_mode').fetchone()[0].lower() != 'wal'
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
        if write and connection.connection.info.pop(_WAL_PENDING, False):
            driver.execute('PRAGMA journal_mode = WAL')
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
