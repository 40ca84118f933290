"""The SQL store: one SQLAlchemy schema with Alembic migrations, on SQLite and PostgreSQL.

`SqlStepStore` takes a URL, an `AsyncEngine` or an `AsyncConnection`; `SqliteStepStore` and
`PostgresStepStore` are its named front doors. `SqlMediaStore` (front doors `SqliteMediaStore` and
`PostgresMediaStore`, also exported by `step_persistence.media`) keeps blobs in the same tables.
`include_name` is the Alembic hook with which an application sharing the database keeps these
tables out of its own autogenerate (`table_names(prefix).include_name` for a store given a
`table_prefix`). See docs/sql.md.
"""

from step_persistence.stores.sql.database_store import SchemaNotReadyError
from step_persistence.stores.sql.media_store import SqlMediaStore
from step_persistence.stores.sql.naming import SchemaClash, TableNames, include_name, table_names
from step_persistence.stores.sql.postgres import PostgresMediaStore, PostgresStepStore
from step_persistence.stores.sql.schema import TABLE_NAMES, TABLES, VERSION_TABLE
from step_persistence.stores.sql.sqlite import SqliteMediaStore, SqliteStepStore
from step_persistence.stores.sql.store import SqlStepStore

__all__ = [
    'TABLES',
    'TABLE_NAMES',
    'VERSION_TABLE',
    'PostgresMediaStore',
    'PostgresStepStore',
    'SchemaClash',
    'SchemaNotReadyError',
    'SqlMediaStore',
    'SqlStepStore',
    'SqliteMediaStore',
    'SqliteStepStore',
    'TableNames',
    'include_name',
    'table_names',
]
