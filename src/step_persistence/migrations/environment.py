"""What `env.py` does, for the `alembic` command and for stores migrating programmatically.

- Programmatic use (Alembic cookbook, "connection sharing"): the caller puts a synchronous
  `Connection`, already inside a transaction, in `config.attributes['connection']` (and the
  schema, if any, in `config.attributes['schema']`, the `TableNames` in
  `config.attributes['table_names']`). The migrations run in that transaction and the caller
  commits it.
- Command line: the database URL comes from `-x url=...`, else the environment variable
  `STEP_PERSISTENCE_DATABASE_URL`, else `sqlalchemy.url` in the ini file; a PostgreSQL schema
  from `-x schema=...` or `STEP_PERSISTENCE_DATABASE_SCHEMA`; a table prefix from
  `-x table_prefix=...`, `STEP_PERSISTENCE_TABLE_PREFIX` or `step_persistence.table_prefix` in
  the ini file. The environment opens its own async engine, migrates in one transaction and
  commits.

The migrations name every table, view, index and constraint through the `TableNames` they are
configured with (`migrations/naming.py`).

Either way the upgrade holds a lock while it reads and changes the schema: a PostgreSQL
transaction-level advisory lock, or SQLite's write lock (`BEGIN IMMEDIATE`), so processes that
start together migrate one after the other and the later ones find nothing to do.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from logging.config import fileConfig

from alembic import context
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import BigInteger, bindparam, text
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateSchema

from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.naming import TableNames, table_names

__all__ = ['DATABASE_SCHEMA_ENV', 'DATABASE_URL_ENV', 'TABLE_PREFIX_ENV', 'advisory_lock_key', 'run_environment']

DATABASE_URL_ENV = 'STEP_PERSISTENCE_DATABASE_URL'
DATABASE_SCHEMA_ENV = 'STEP_PERSISTENCE_DATABASE_SCHEMA'
TABLE_PREFIX_ENV = 'STEP_PERSISTENCE_TABLE_PREFIX'


def advisory_lock_key(schema: str | None, table_prefix: str = '') -> int:
    """The PostgreSQL advisory lock key guarding migrations of the tables `table_prefix` names in `schema`
    (signed 64-bit)."""
    location = schema or ''
    if table_prefix:
        location = f'{location}:{table_prefix}'
    digest = hashlib.sha256(f'step_persistence.migrations:{location}'.encode()).digest()
    return int.from_bytes(digest[:8], 'big', signed=True)


def _configures_logging(config: Config) -> bool:
    """Whether the ini file has the sections `logging.config.fileConfig` needs (a minimal one has only
    `[alembic]`)."""
    return all(config.file_config.has_section(name) for name in ('loggers', 'handlers', 'formatters'))


def _url(config: Config) -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get('url')
        or os.environ.get(DATABASE_URL_ENV)
        or config.get_main_option('sqlalchemy.url')
    )
    if not url:
        raise CommandError(
            f'no database URL: pass -x url=sqlite:///runs.db (or postgresql://...), or set {DATABASE_URL_ENV}'
        )
    return url


def _names(config: Config) -> TableNames:
    names = config.attributes.get('table_names')
    if isinstance(names, TableNames):
        return names
    prefix = (
        context.get_x_argument(as_dictionary=True).get('table_prefix')
        or os.environ.get(TABLE_PREFIX_ENV)
        or config.get_main_option('step_persistence.table_prefix')
        or ''
    )
    try:
        return table_names(prefix)
    except ValueError as error:
        raise CommandError(str(error)) from error


def _schema(config: Config) -> str | None:
    schema = config.attributes.get('schema')
    if schema is None:
        schema = context.get_x_argument(as_dictionary=True).get('schema') or os.environ.get(DATABASE_SCHEMA_ENV)
    return schema or None


def _lock(connection: Connection, schema: str | None, names: TableNames) -> None:
    if connection.dialect.name == 'postgresql':
        lock = text('SELECT pg_advisory_xact_lock(:key)').bindparams(bindparam('key', type_=BigInteger))
        connection.execute(lock, {'key': advisory_lock_key(schema, names.prefix)})
    elif not connection.connection.driver_connection.in_transaction:  # type: ignore[union-attr]
        connection.exec_driver_sql('BEGIN IMMEDIATE')


def migrate_on_connection(connection: Connection, schema: str | None, names: TableNames) -> None:
    """Run the requested migrations on `connection`, in its transaction, under the migration lock.

    With a schema (PostgreSQL), the schema is created if missing and the migrations run with
    `search_path` set to it for the rest of the transaction's migration work, then restored.
    """
    _lock(connection, schema, names)
    previous_path: str | None = None
    if schema is not None:
        connection.execute(CreateSchema(schema, if_not_exists=True))
        previous_path = connection.execute(text("SELECT current_setting('search_path')")).scalar_one()
        quoted = connection.dialect.identifier_preparer.quote_identifier(schema)
        connection.execute(text("SELECT set_config('search_path', :path, true)"), {'path': quoted})
    try:
        context.configure(
            connection=connection,
            target_metadata=names.metadata(),
            version_table=names.version_table,
            version_table_schema=schema,
            render_as_batch=connection.dialect.name == 'sqlite',
            include_name=lambda name, type_, parents: type_ != 'table' or names.owns(name),
            compare_type=True,
            table_names=names,
        )
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if previous_path is not None:
            connection.execute(text("SELECT set_config('search_path', :path, true)"), {'path': previous_path})


async def _migrate_with_own_engine(url: str, schema: str | None, names: TableNames) -> None:
    database = Database.from_url(url, schema=schema, table_prefix=names.prefix)
    try:
        await database.run(lambda transaction: migrate_on_connection(transaction.connection, schema, names), write=True)
    finally:
        await database.aclose()


def _run_offline(config: Config, schema: str | None, names: TableNames) -> None:
    if schema is not None:
        raise CommandError('offline (--sql) mode does not support a schema; set search_path in the generated script')
    context.configure(
        url=_url(config),
        target_metadata=names.metadata(),
        version_table=names.version_table,
        literal_binds=True,
        dialect_opts={'paramstyle': 'named'},
        table_names=names,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_environment() -> None:
    """Alembic's `env.py` body: online with the caller's or an own connection, or offline (`--sql`)."""
    config = context.config
    connection = config.attributes.get('connection')
    schema = _schema(config)
    names = _names(config)
    if connection is None and config.config_file_name is not None and _configures_logging(config):
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    if context.is_offline_mode():
        _run_offline(config, schema, names)
    elif connection is None:
        asyncio.run(_migrate_with_own_engine(_url(config), schema, names))
    else:
        migrate_on_connection(connection, schema, names)
