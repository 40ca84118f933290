"""`DatabaseStore`: what the SQL step store and the SQL media store share, a `Database` and its schema.

Either store opens a `Database` (or, as a step store's default media store, is given the step
store's) and closes only what it owns. Stores sharing one `Database` share what it knows of its
schema, so the pair migrates (or checks the revision) once.

Reading never writes. Before its first write a store that migrates automatically creates the
tables (and a SQLite file, with its directory) or upgrades them (`_ready`); before its first read
it only looks (`_ready_to_read`):

- a database that holds no tables yet (a SQLite file that does not exist, a database or
  PostgreSQL schema without them) is an empty store: reads find nothing, and nothing is created;
- tables at the revision this version reads are read, and the revision is not checked again;
- tables at an older revision (or a newer one, or without a recorded revision) make the read
  raise `SchemaNotReadyError`, which says how to upgrade them: `step-persistence db upgrade`,
  `await store.migrate()`, or a write of a store that migrates automatically.

The revision is read with one query of the version table, without importing Alembic.
"""

from __future__ import annotations

from functools import partial
from typing import NoReturn

from sqlalchemy import column, inspect, select, table
from sqlalchemy.exc import DBAPIError

from step_persistence._closing import ClosesOnExit
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.naming import CLASH_REMEDY

__all__ = ['HEAD_REVISION', 'SCHEMA_REVISIONS', 'DatabaseStore', 'SchemaNotReadyError']

SCHEMA_REVISIONS: tuple[str, ...] = ('0001', '0002', '0003', '0004', '0005', '0006', '0007', '0008')
"""The revisions of the packaged migrations, oldest first (tests/sql/test_sql_read_only.py checks them
against Alembic's history), so that a read checks the revision without importing Alembic."""

HEAD_REVISION = SCHEMA_REVISIONS[-1]
"""The revision this version of the package reads and writes."""

UPGRADE_HINT = 'run `step-persistence db upgrade` (or `await store.migrate()`)'
"""How to bring a database to `HEAD_REVISION`; a write of a store that migrates automatically also does."""


class SchemaNotReadyError(RuntimeError):
    """A SQL store's tables are not at the revision this version reads, and reading never migrates them.

    The message is `problem` (what the database holds) and `remedy` (what to do). `revision` is the
    revision the database records (`None` when it records none); `upgradable`: whether upgrading
    the database (`step-persistence db upgrade`, `await store.migrate()`) is the remedy. Raised by
    reads (and `ready_database()`), never by writes, which create or upgrade the tables when the
    store migrates automatically.
    """

    def __init__(self, problem: str, remedy: str, *, revision: str | None, upgradable: bool) -> None:
        super().__init__(f'{problem}: {remedy}')
        self.problem = problem
        self.remedy = remedy
        self.revision = revision
        self.upgradable = upgradable


def _recorded_schema(transaction: Transaction, *, schema: str | None) -> tuple[list[str], list[str]]:
    """The revisions the version table records (none without the table) and, when it records none,
    the tables named as the store's that exist anyway (made by other means, or the application's)."""
    connection = transaction.connection
    names = transaction.names
    inspector = inspect(connection)
    revisions: list[str] = []
    if inspector.has_table(names.version_table, schema=schema):
        version = table(names.version_table, column('version_num'), schema=schema)
        revisions = [str(row[0]) for row in connection.execute(select(version.c.version_num))]
    if revisions:
        return revisions, []
    return revisions, sorted(set(inspector.get_table_names(schema=schema)) & names.tables)


class DatabaseStore(ClosesOnExit):
    """A store on one `Database`: its schema checked before the first read and made ready before the first
    write, and closed if the store owns it."""

    _db: Database
    _auto_migrate: bool
    _owns_database: bool

    def _attach(self, database: Database, *, auto_migrate: bool, owns_database: bool = True) -> None:
        """Use `database` from now on; `owns_database`: `aclose()` closes it (what the store opened itself)."""
        self._db = database
        self._auto_migrate = auto_migrate
        self._owns_database = owns_database

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self._db.description})'

    async def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (what `auto_migrate` does before the first write)."""
        from step_persistence.stores.sql.migrate import upgrade  # Alembic is imported only to migrate

        await upgrade(self._db)
        self._db.migrated = True

    async def has_schema(self) -> bool:
        """Whether the database holds the store's tables at the revision this version reads.

        `False` when nothing was ever stored there (a SQLite file that does not exist, a database
        or PostgreSQL schema without the tables). Raises `SchemaNotReadyError` for tables at another
        revision, or without a recorded one. Creates and migrates nothing, whatever `auto_migrate`
        says: one query of the version table (none once the revision is known to be current).
        """
        database = self._db
        if database.migrated:
            return True
        if database.sqlite_file is not None and not database.sqlite_file.exists():
            return False
        async with database.migration_lock:  # a migration of this process in progress finishes first
            if database.migrated:
                return True
            revisions, tables_without_revision = await database.run(
                partial(_recorded_schema, schema=database.schema), write=False
            )
            if revisions == [HEAD_REVISION]:
                database.migrated = True
                return True
        problem = self._schema_problem(revisions, tables_without_revision, unmigrated='reading never migrates')
        if problem is None:
            return False
        raise problem

    def _schema_problem(
        self, revisions: list[str], tables_without_revision: list[str], *, unmigrated: str
    ) -> SchemaNotReadyError | None:
        """Why tables not at `HEAD_REVISION` cannot be used (`None`: the database holds none of them); `unmigrated`
        says why an older revision was not upgraded."""
        where = f'the database ({self._db.description})'
        if tables_without_revision:
            return SchemaNotReadyError(
                f'{where} holds tables named {", ".join(tables_without_revision)} but records no schema revision',
                CLASH_REMEDY,
                revision=None,
                upgradable=False,
            )
        if not revisions:
            return None
        recorded = ', '.join(revisions)
        if len(revisions) == 1 and revisions[0] in SCHEMA_REVISIONS:
            return SchemaNotReadyError(
                f'{where} is at schema revision {recorded}, older than {HEAD_REVISION}, the one this version '
                f'of step-persistence reads, and {unmigrated}',
                UPGRADE_HINT,
                revision=revisions[0],
                upgradable=True,
            )
        return SchemaNotReadyError(
            f'{where} is at schema revision {recorded}, which this version of step-persistence does not know '
            f'(it reads {HEAD_REVISION}): a newer version migrated it',
            'upgrade step-persistence to read it',
            revision=revisions[0],
            upgradable=False,
        )

    async def _explain(self, error: DBAPIError) -> NoReturn:
        """Raise why a statement failed with the database's `error`: `SchemaNotReadyError` when the database is not
        at `HEAD_REVISION` (with `auto_migrate=False` nothing upgrades it, and a table a newer revision adds is
        missing), else `error` itself. Reads the version table, and only after a failure."""
        database = self._db
        if not database.migrated:
            try:
                revisions, tables_without_revision = await database.run(
                    partial(_recorded_schema, schema=database.schema), write=False
                )
            except DBAPIError:
                raise error from None
            if revisions != [HEAD_REVISION]:
                unmigrated = (
                    'reading never migrates'
                    if self._auto_migrate
                    else 'the store does not migrate (auto_migrate=False)'
                )
                problem = self._schema_problem(revisions, tables_without_revision, unmigrated=unmigrated)
                if problem is not None:
                    raise problem from error
        raise error

    async def ready_database(self, *, write: bool = False) -> Database:
        """The store's database, ready to read, or with `write` ready to write.

        For step_persistence's own use: the reporting views (`stores/sql/reporting.py`) are read
        through it, and `step-persistence copy` makes its destination ready. To read, nothing is
        created or migrated: `SchemaNotReadyError` when the tables are missing (nothing was stored
        yet) or at another revision (with `auto_migrate=False`, only a missing SQLite file is
        checked). With `write`, a store that migrates automatically creates or upgrades them first.
        """
        if write:
            await self._ready()
        elif not await self._ready_to_read():
            raise SchemaNotReadyError(
                f'the database ({self._db.description}) holds no step-persistence tables yet (nothing was '
                'stored there)',
                f'{UPGRADE_HINT} to create them',
                revision=None,
                upgradable=True,
            )
        return self._db

    async def _ready_to_read(self) -> bool:
        """Before a read: whether there is anything to read (`False`: the database holds nothing yet, so the
        read finds nothing). Never creates or migrates; see the module's docstring.

        With `auto_migrate=False` the schema is the caller's business and only a SQLite file is
        checked (opening one that does not exist would create it).
        """
        database = self._db
        if database.migrated:
            return True
        if not self._auto_migrate:
            return database.sqlite_file is None or database.sqlite_file.exists()
        return await self.has_schema()

    async def _ready(self) -> None:
        """Before a write: with `auto_migrate`, migrate unless the database is known to be up to date;
        concurrent callers wait for one migration."""
        database = self._db
        if not self._auto_migrate or database.migrated:
            return
        async with database.migration_lock:
            if not database.migrated:
                await self.migrate()

    async def aclose(self) -> None:
        """Dispose of the engine if the store created it from a URL; a caller's engine or connection, and a
        database shared with another store, are left alone."""
        if self._owns_database:
            await self._db.aclose()
