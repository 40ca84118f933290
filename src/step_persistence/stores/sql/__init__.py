"""The SQL store: one SQLAlchemy schema with Alembic migrations, on SQLite and PostgreSQL.

`SqlStepStore` takes a URL, an `AsyncEngine` or an `AsyncConnection`; `SqliteStepStore` and
`PostgresStepStore` are its named front doors. `SqlMediaStore` (front doors `SqliteMediaStore` and
`PostgresMediaStore`, also exported by `step_persistence.media`) keeps blobs in the same tables.
`include_name` is the Alembic hook with which an application sharing the database keeps these
tables out of its own autogenerate. See docs/sql.md.
"""

from step_persistence.stores.sql.media_store import SqlMediaStore
from step_persistence.stores.sql.postgres import PostgresMediaStore, PostgresStepStore
from step_persistence.stores.sql.schema import TABLE_NAMES, VERSION_TABLE, Base, include_name
from step_persistence.stores.sql.sqlite import SqliteMediaStore, SqliteStepStore
from step_persistence.stores.sql.store import SqlStepStore

__all__ = [
    'TABLE_NAMES',
    'VERSION_TABLE',
    'Base',
    'PostgresMediaStore',
    'PostgresStepStore',
    'SqlMediaStore',
    'SqlStepStore',
    'SqliteMediaStore',
    'SqliteStepStore',
    'include_name',
]
