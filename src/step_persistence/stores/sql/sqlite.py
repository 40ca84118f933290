"""`SqliteStepStore`: the embedded default, one SQLite file per database and no setup."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Literal

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from step_persistence.media.protocol import MediaStore
from step_persistence.stores.sql.database import DEFAULT_BUSY_TIMEOUT, Database
from step_persistence.stores.sql.dialects import resolve_url
from step_persistence.stores.sql.store import DEFAULT_MEDIA_THRESHOLD_BYTES, SqlStepStore

__all__ = ['SqliteStepStore', 'database_from_url']


class SqliteStepStore(SqlStepStore):
    """A SQL store on SQLite.

    - `SqliteStepStore('runs.db')` (the default) or any path: the file and its directory are
      created and the schema upgraded on first use. The store owns the engine: WAL journal,
      foreign keys on, and a busy timeout of `busy_timeout` seconds so concurrent writers (other
      processes included) wait for each other instead of failing. Each operation commits.
    - `SqliteStepStore(':memory:')`: one private in-memory database, gone at `aclose()`.
    - `SqliteStepStore(connection=conn)`: a caller's `sqlite3.Connection`, opened with
      `check_same_thread=False` (the store uses it from a worker thread). The store commits each
      of its own operations on it, so other connections see the data at once, and never closes
      it. Do not leave uncommitted changes of your own on it while the store is in use: they
      would be committed (or, when a store operation fails, rolled back) with the store's.
    - An application's `AsyncEngine` (never disposed) or `AsyncConnection` (the store writes
      in the caller's transaction and never commits, rolls back or closes it).
    """

    def __init__(
        self,
        database: str | os.PathLike[str] | AsyncEngine | AsyncConnection | None = None,
        *,
        connection: sqlite3.Connection | None = None,
        auto_migrate: bool = True,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        target: Database | AsyncEngine | AsyncConnection
        if connection is not None:
            if database is not None:
                raise TypeError('pass either database= or connection=, not both')
            if not isinstance(connection, sqlite3.Connection):
                raise TypeError(f'connection= must be a sqlite3.Connection, got {type(connection).__name__}')
            target = Database.from_sqlite3(connection)
        elif isinstance(database, AsyncEngine | AsyncConnection):
            if database.dialect.name != 'sqlite':
                raise ValueError(f'SqliteStepStore needs a SQLite engine or connection, got {database.dialect.name}')
            target = database
        else:
            target = Database.from_url(_sqlite_url(database), busy_timeout=busy_timeout)
        super().__init__(
            target,
            auto_migrate=auto_migrate,
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
        )


def _sqlite_url(database: str | os.PathLike[str] | None) -> URL:
    if database is None:
        database = 'runs.db'
    name = os.fspath(database)
    if name != ':memory:':
        Path(name).parent.mkdir(parents=True, exist_ok=True)
    return URL.create('sqlite+aiosqlite', database=name)


def database_from_url(url: str | URL) -> str:
    """The `database` argument for a `sqlite://` URL: its path, or `':memory:'` for `sqlite://`.

    Raises `ValueError` for a URL of another dialect or driver (naming the supported ones).
    """
    resolved = resolve_url(url)
    if resolved.get_backend_name() != 'sqlite':
        raise ValueError(f'not a SQLite URL: {resolved.render_as_string(hide_password=True)}')
    return resolved.database or ':memory:'
