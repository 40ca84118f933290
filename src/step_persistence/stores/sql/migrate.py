"""Running the packaged Alembic migrations from code, on a store's own connection or the caller's."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.schema import VERSION_TABLE

__all__ = ['SCRIPT_LOCATION', 'alembic_config', 'current', 'downgrade', 'head_revision', 'stamp', 'upgrade']

SCRIPT_LOCATION = 'step_persistence:migrations'
"""Where Alembic finds the migrations in an installed package."""


def alembic_config(*, connection: Connection | None = None, schema: str | None = None) -> Config:
    """An Alembic `Config` for the packaged migrations, optionally bound to a caller's connection.

    With `connection` (synchronous, inside a transaction the caller commits), `env.py` migrates
    on it instead of opening its own engine.
    """
    config = Config()
    config.set_main_option('script_location', SCRIPT_LOCATION)
    config.attributes['connection'] = connection
    config.attributes['schema'] = schema
    return config


def _upgrade(connection: Connection, schema: str | None, revision: str) -> None:
    command.upgrade(alembic_config(connection=connection, schema=schema), revision)


def _downgrade(connection: Connection, schema: str | None, revision: str) -> None:
    command.downgrade(alembic_config(connection=connection, schema=schema), revision)


def _stamp(connection: Connection, schema: str | None, revision: str) -> None:
    command.stamp(alembic_config(connection=connection, schema=schema), revision)


def _current(connection: Connection, schema: str | None) -> str | None:
    options = {'version_table': VERSION_TABLE, 'version_table_schema': schema}
    return MigrationContext.configure(connection, opts=options).get_current_revision()


def head_revision() -> str | None:
    """The newest revision of the packaged migrations."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def upgrade(database: Database, revision: str = 'head') -> None:
    """Upgrade `database` to `revision` in one write transaction (the caller's, for a shared connection)."""
    async with database.transaction(write=True) as connection:
        await connection.run_sync(_upgrade, database.schema, revision)


async def downgrade(database: Database, revision: str) -> None:
    """Downgrade `database` to `revision` (`'base'` removes every table and view) in one write transaction."""
    async with database.transaction(write=True) as connection:
        await connection.run_sync(_downgrade, database.schema, revision)


async def stamp(database: Database, revision: str) -> None:
    """Record `revision` as applied to `database` without running any migration (`'base'` clears it)."""
    async with database.transaction(write=True) as connection:
        await connection.run_sync(_stamp, database.schema, revision)


async def current(database: Database) -> str | None:
    """The revision `database` is at; `None` when no revision is recorded (never migrated, or at base)."""
    async with database.transaction(write=False) as connection:
        return await connection.run_sync(_current, database.schema)
