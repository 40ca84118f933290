"""Running the packaged Alembic migrations from code, on a store's own connection or the caller's."""

from __future__ import annotations

import threading
from functools import partial
from typing import TypeVar

import anyio.to_thread
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Operation, Transaction
from step_persistence.stores.sql.naming import DEFAULT_NAMES, TableNames

T = TypeVar('T')

__all__ = ['SCRIPT_LOCATION', 'alembic_config', 'current', 'downgrade', 'head_revision', 'stamp', 'upgrade']

SCRIPT_LOCATION = 'step_persistence:migrations'
"""Where Alembic finds the migrations in an installed package."""


def alembic_config(
    *, connection: Connection | None = None, schema: str | None = None, names: TableNames = DEFAULT_NAMES
) -> Config:
    """An Alembic `Config` for the packaged migrations, optionally bound to a caller's connection.

    With `connection` (synchronous, inside a transaction the caller commits), `env.py` migrates
    on it instead of opening its own engine; `names` are the tables' (a table prefix).
    """
    config = Config()
    config.set_main_option('script_location', SCRIPT_LOCATION)
    config.attributes['connection'] = connection
    config.attributes['schema'] = schema
    config.attributes['table_names'] = names
    return config


def _config(transaction: Transaction, schema: str | None) -> Config:
    return alembic_config(connection=transaction.connection, schema=schema, names=transaction.names)


def _upgrade(transaction: Transaction, schema: str | None, revision: str) -> None:
    command.upgrade(_config(transaction, schema), revision)


def _downgrade(transaction: Transaction, schema: str | None, revision: str) -> None:
    command.downgrade(_config(transaction, schema), revision)


def _stamp(transaction: Transaction, schema: str | None, revision: str) -> None:
    command.stamp(_config(transaction, schema), revision)


def _current(transaction: Transaction, schema: str | None) -> str | None:
    options = {'version_table': transaction.names.version_table, 'version_table_schema': schema}
    return MigrationContext.configure(transaction.connection, opts=options).get_current_revision()


def head_revision() -> str | None:
    """The newest revision of the packaged migrations."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


_ALEMBIC = threading.Lock()
"""Alembic keeps the running migration's context in module globals: one migration at a time per process."""


async def _one_at_a_time(database: Database, operation: Operation[T], *, write: bool) -> T:
    """Run `operation` on `database` while no other migration of this process runs (on any thread or loop)."""
    if not _ALEMBIC.acquire(blocking=False):
        await anyio.to_thread.run_sync(_ALEMBIC.acquire)
    try:
        return await database.run(operation, write=write)
    finally:
        _ALEMBIC.release()


async def upgrade(database: Database, revision: str = 'head') -> None:
    """Upgrade `database` to `revision` in one write transaction (the caller's, for a shared connection).

    A SQLite file that does not exist is created here, with its directory: the first migration is
    what creates a store's database (a read never does).
    """
    if database.sqlite_file is not None:
        database.sqlite_file.parent.mkdir(parents=True, exist_ok=True)
    await _one_at_a_time(database, partial(_upgrade, schema=database.schema, revision=revision), write=True)


async def downgrade(database: Database, revision: str) -> None:
    """Downgrade `database` to `revision` (`'base'` removes every table and view) in one write transaction."""
    await _one_at_a_time(database, partial(_downgrade, schema=database.schema, revision=revision), write=True)


async def stamp(database: Database, revision: str) -> None:
    """Record `revision` as applied to `database` without running any migration (`'base'` clears it)."""
    await _one_at_a_time(database, partial(_stamp, schema=database.schema, revision=revision), write=True)


async def current(database: Database) -> str | None:
    """The revision `database` is at; `None` when no revision is recorded (never migrated, or at base)."""
    return await database.run(partial(_current, schema=database.schema), write=False)
