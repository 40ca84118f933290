"""The SQLite front doors: `SqliteStepStore`, the embedded default, and `SqliteMediaStore`, one file and no setup.

Both open their database with `Database.for_sqlite` (a path, `':memory:'`, a caller's
`sqlite3.Connection`, engine or connection), so the two take it the same way.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy.engine import URL

from step_persistence.media.protocol import PublicUrlResolver
from step_persistence.stores._media import DEFAULT_THRESHOLD_BYTES, MediaSetting
from step_persistence.stores.sql.database import DEFAULT_BUSY_TIMEOUT, Database, SqliteSynchronous, SqliteTarget
from step_persistence.stores.sql.dialects import redact, resolve_url
from step_persistence.stores.sql.media_store import SqlMediaStore
from step_persistence.stores.sql.store import SqlStepStore

__all__ = ['SqliteMediaStore', 'SqliteStepStore', 'database_from_url']


class SqliteStepStore(SqlStepStore):
    """A SQL store on SQLite.

    - `SqliteStepStore('runs.db')` (the default) or any path: the file and its directory are
      created and the schema upgraded before the first write; reading never writes (reads of a
      file that does not exist find nothing, and create nothing). The store owns the engine: WAL journal,
      foreign keys on, and a busy timeout of `busy_timeout` seconds so concurrent writers (other
      processes included) wait for each other instead of failing. Each operation commits.
      `synchronous='NORMAL'` (the default) makes every commit survive the crash or kill of any
      process; `'FULL'` also fsyncs each commit, so it survives power loss (see docs/sql.md).
    - `SqliteStepStore(':memory:')`: one private in-memory database, gone at `aclose()`.
    - `SqliteStepStore(connection=conn)`: a caller's `sqlite3.Connection`, opened with
      `check_same_thread=False` (the store uses it from a worker thread). The store commits each
      of its own operations on it, so other connections see the data at once, and never closes
      it. Do not leave uncommitted changes of your own on it while the store is in use: they
      would be committed (or, when a store operation fails, rolled back) with the store's.
    - An application's `AsyncEngine` (never disposed) or `AsyncConnection` (the store writes
      in the caller's transaction and never commits, rolls back or closes it).

    `table_prefix` starts every name of the store's schema with it, as for `SqlStepStore`.
    """

    def __init__(
        self,
        database: SqliteTarget = None,
        *,
        connection: sqlite3.Connection | None = None,
        table_prefix: str = '',
        auto_migrate: bool = True,
        max_snapshots_per_run: int | None = None,
        media_store: MediaSetting = 'auto',
        media_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: SqliteSynchronous = 'NORMAL',
    ) -> None:
        self._start(
            Database.for_sqlite(
                database,
                connection=connection,
                busy_timeout=busy_timeout,
                synchronous=synchronous,
                table_prefix=table_prefix,
                owner='SqliteStepStore',
            ),
            auto_migrate=auto_migrate,
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
        )


class SqliteMediaStore(SqlMediaStore):
    """A SQL media store on SQLite: a path (default `runs.db`, created on first use), `':memory:'`,
    a caller's `sqlite3.Connection` (`connection=`), or a SQLite `AsyncEngine`/`AsyncConnection`,
    with the same ownership and commit rules as `SqliteStepStore`; `table=` keeps the blobs in a table of
    that name (see `SqlMediaStore`)."""

    def __init__(
        self,
        database: SqliteTarget = None,
        *,
        connection: sqlite3.Connection | None = None,
        table_prefix: str = '',
        table: str | None = None,
        auto_migrate: bool = True,
        public_url: PublicUrlResolver | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        self._start(
            Database.for_sqlite(
                database,
                connection=connection,
                busy_timeout=busy_timeout,
                table_prefix=table_prefix,
                owner='SqliteMediaStore',
            ),
            auto_migrate=auto_migrate,
            public_url=public_url,
            table=table,
        )


def database_from_url(url: str | URL) -> str:
    """The `database` argument for a `sqlite://` URL: its path, or `':memory:'` for `sqlite://`.

    Raises `ValueError` for a URL of another dialect or driver (naming the supported ones).
    """
    resolved = resolve_url(url)
    if resolved.get_backend_name() != 'sqlite':
        raise ValueError(f'not a SQLite URL: {redact(resolved)}')
    return resolved.database or ':memory:'
