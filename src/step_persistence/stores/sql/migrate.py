"""Running the packaged Alembic migrations from code, on a store's own connection or the caller's."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection

from step_persistence.stores.sql.database import Database

__all__ = ['SCRIPT_LOCATION', 'alembic_config', 'downgrade', 'upgrade']

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


async def upgrade(database: Database, revision: str = 'head') -> None:
    """Upgrade `database` to `revision` in one write transaction (the caller's, for a shared connection)."""
    async with database.transaction(write=True) as connection:
        await connection.run_sync(_upgrade, database.schema, revision)


async def downgrade(database: Database, revision: str) -> None:
    """Downgrade `database` to `revision` (`'base'` removes every table) in one write transaction."""
    async with database.transaction(write=True) as connection:
        await connection.run_sync(_downgrade, database.schema, revision)
