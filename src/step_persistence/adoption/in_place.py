"""`step-persistence db adopt --store URL`: a database pydantic-ai-harness wrote, converted into our schema in place.

One transaction does it all, so a failure leaves the database as it was:

1. find the harness's tables (`HarnessTables`: SQLite's `runs`, `events`... ; PostgreSQL's
   `step_persistence_runs`... or those of another `table=`);
2. on SQLite, rename them `harness_<name>`: ours have the same names (PostgreSQL's do not clash
   and stay as they are);
3. create our tables (or upgrade them) with the packaged Alembic migrations, which records the
   revision in our version table;
4. copy every harness run that our tables do not hold yet (record, events, effects, snapshots
   with their media), read back and compared (`copy_runs`). An item that cannot be read fails
   the adoption (the harness store is read `strict`ly), so nothing is left behind unsaid.

The harness's tables are kept, renamed on SQLite, untouched on PostgreSQL: nothing is lost, and a
deployment may go on reading them with the harness until it moves. Dropping them is left to the
operator (`AdoptionPlan.drop_statements`). A second adoption finds every run already there: it
writes nothing. Runs the harness wrote after an adoption are copied by the next one.

`plan_adoption` tells what `adopt` would do, reading only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from step_persistence.copying import CopyReport, RunCopy, copy_runs
from step_persistence.protocol import StepStore
from step_persistence.stores.harness.sql import DEFAULT_POSTGRES_TABLE, HarnessSqlStore, HarnessTables, read_only_engine

__all__ = ['ADOPTED_PREFIX', 'AdoptionError', 'AdoptionPlan', 'HarnessTablesNotFound', 'adopt', 'plan_adoption']

ADOPTED_PREFIX = 'harness_'
"""What the harness's SQLite tables are renamed to start with (`runs` -> `harness_runs`)."""


class AdoptionError(Exception):
    """A run could not be converted, or there is nothing to adopt: nothing was changed."""


class HarnessTablesNotFound(AdoptionError, LookupError):
    """The database holds no pydantic-ai-harness tables."""


@dataclass(frozen=True)
class AdoptionPlan:
    """What `adopt` does to one database (or did: `adopt` returns the plan it carried out)."""

    dialect: str
    tables: HarnessTables
    """The harness's tables as they are now."""
    renames: list[tuple[str, str]]
    """SQLite's tables to rename, old name -> new name (none once adopted, none on PostgreSQL)."""
    revision: str | None
    """Our schema's revision now (`None`: our tables do not exist yet)."""
    head: str | None
    """The revision the adoption brings our tables to."""
    runs: list[str]
    """The harness runs to convert (those our tables do not hold yet), oldest first."""
    already_adopted: list[str] = field(default_factory=list[str])
    """Harness runs our tables already hold (left as they are)."""
    copied: CopyReport | None = None
    """What the conversion did (`adopt` only)."""

    @property
    def adopted_tables(self) -> HarnessTables:
        """The harness's tables once adopted."""
        if not self.renames:
            return self.tables
        return HarnessTables.sqlite(prefix=ADOPTED_PREFIX, media=self.tables.media)

    @property
    def changes_nothing(self) -> bool:
        """Whether adopting would write nothing (the tables renamed, the schema at its newest, every run there)."""
        return not self.renames and self.revision == self.head and not self.runs

    def drop_statements(self) -> list[str]:
        """The statements that drop the harness's tables once they are no longer wanted (adopt never runs them)."""
        return [f'DROP TABLE {name}' for name in self.adopted_tables.names()]

    def summary(self) -> dict[str, object]:
        """The plan as plain values (`--json`)."""
        return {
            'dialect': self.dialect,
            'harness_tables': self.tables.names(),
            'renames': [list(rename) for rename in self.renames],
            'revision': self.revision,
            'head': self.head,
            'runs': self.runs,
            'already_adopted': self.already_adopted,
            'copied': None if self.copied is None else self.copied.copied,
            'kept_tables': self.adopted_tables.names(),
        }

    def describe(self) -> list[str]:
        """What the plan does, one line per step."""
        lines = [f'pydantic-ai-harness tables found: {", ".join(self.tables.names())}']
        lines += [f'rename table {old} to {new}' for old, new in self.renames]
        if self.revision != self.head:
            before = 'create the step-persistence tables' if self.revision is None else f'upgrade from {self.revision}'
            lines.append(f'{before} at revision {self.head} (recorded in the Alembic version table)')
        lines.append(f'convert {len(self.runs)} run(s); {len(self.already_adopted)} already adopted')
        return lines


def _engine(url: str | URL, *, write: bool) -> AsyncEngine:
    """An engine on the database at `url`: read-only, or whose transactions include DDL (SQLite: `BEGIN
    IMMEDIATE`, so that the renames and the migration are rolled back with the rest)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == 'postgres':
        parsed = parsed.set(drivername='postgresql')
    backend = parsed.get_backend_name()
    if backend not in ('sqlite', 'postgresql') or (backend == 'sqlite' and parsed.database in (None, '', ':memory:')):
        raise ValueError('adoption needs a SQLite file (sqlite:///old.db) or a PostgreSQL database (postgresql://...)')
    if not write:
        return read_only_engine(parsed)
    if backend == 'postgresql':
        return create_async_engine(parsed.set(drivername='postgresql+asyncpg'))
    engine = create_async_engine(parsed.set(drivername='sqlite+aiosqlite'))

    @event.listens_for(engine.sync_engine, 'connect')
    def manual_transactions(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite would commit before DDL otherwise

    @event.listens_for(engine.sync_engine, 'begin')
    def begin(connection: Connection) -> None:
        connection.exec_driver_sql('BEGIN IMMEDIATE')

    return engine


def _found(connection: Connection, table: str) -> tuple[HarnessTables, list[tuple[str, str]]]:
    """The harness's tables in the database, and the renames adoption makes (`AdoptionError` if none)."""
    inspector = inspect(connection)
    names = set(inspector.get_table_names())
    if connection.dialect.name == 'sqlite':
        media = 'media'
        original = HarnessTables.sqlite(media=media)
        if original.runs in names and 'messages' in {column['name'] for column in inspector.get_columns('snapshots')}:
            adopted = HarnessTables.sqlite(prefix=ADOPTED_PREFIX, media=media)
            present = [name for name in original.names() if name in names]
            return original, [
                (name, ADOPTED_PREFIX + name) for name in present if ADOPTED_PREFIX + name in adopted.names()
            ]
        adopted = HarnessTables.sqlite(prefix=ADOPTED_PREFIX, media=media)
        if adopted.runs in names:
            return adopted, []
    else:
        tables = HarnessTables.postgres(table=table)
        if tables.runs in names:
            return tables, []
    raise HarnessTablesNotFound('no pydantic-ai-harness tables in this database (nothing to adopt)')


@asynccontextmanager
async def _transaction(url: str | URL, *, write: bool) -> AsyncIterator[AsyncConnection]:
    engine = _engine(url, write=write)
    try:
        async with engine.connect() as connection, connection.begin():
            yield connection
    finally:
        await engine.dispose()


async def _runs(harness: HarnessSqlStore, ours: StepStore | None) -> tuple[list[str], list[str]]:
    """The harness's runs that `ours` does not hold (all of them without it), and those it holds."""
    held = set() if ours is None else {record.run_id for record in await ours.list_runs()}
    runs = [record.run_id for record in await harness.list_runs()]
    return [run_id for run_id in runs if run_id not in held], [run_id for run_id in runs if run_id in held]


async def _plan(connection: AsyncConnection, table: str) -> AdoptionPlan:
    from step_persistence.stores.sql import SqlStepStore, migrate
    from step_persistence.stores.sql.database import Database

    tables, renames = await connection.run_sync(_found, table)
    revision = await migrate.current(Database.borrowing(connection))
    head = migrate.head_revision()
    # Our tables at an older revision are read once upgraded (by `adopt`): until then every run is to convert.
    ours = SqlStepStore(connection, auto_migrate=False) if revision == head else None
    todo, held = await _runs(HarnessSqlStore(connection, tables, description='the harness tables'), ours)
    return AdoptionPlan(
        dialect=connection.dialect.name,
        tables=tables,
        renames=renames,
        revision=revision,
        head=head,
        runs=todo,
        already_adopted=held,
    )


async def plan_adoption(url: str | URL, *, table: str = DEFAULT_POSTGRES_TABLE) -> AdoptionPlan:
    """What `adopt(url)` would do; reads only (a read-only transaction)."""
    async with _transaction(url, write=False) as connection:
        return await _plan(connection, table)


async def adopt(
    url: str | URL, *, table: str = DEFAULT_POSTGRES_TABLE, on_run: Callable[[RunCopy], object] | None = None
) -> AdoptionPlan:
    """Convert the pydantic-ai-harness database at `url` (`sqlite:///old.db`, `postgresql://...`) into
    our schema, in one transaction (see the module's docstring); `table`: the harness's PostgreSQL
    `table=`. Returns the plan carried out, with what the copy did.

    Raises `AdoptionError` (and changes nothing) when the database holds no harness tables or a run
    could not be converted.
    """
    from step_persistence.stores.sql import SqlStepStore

    async with _transaction(url, write=True) as connection:
        plan = await _plan(connection, table)
        preparer = connection.dialect.identifier_preparer
        for old, new in plan.renames:
            await connection.exec_driver_sql(f'ALTER TABLE {preparer.quote(old)} RENAME TO {preparer.quote(new)}')
        ours = SqlStepStore(connection, auto_migrate=False)
        await ours.migrate()
        harness = HarnessSqlStore(connection, plan.adopted_tables, description='the harness tables', strict=True)
        todo, held = await _runs(harness, ours)
        report = await copy_runs(harness, ours, run_ids=todo, on_run=on_run) if todo else CopyReport()
        if not report.ok:
            failures = '; '.join(f'{run_id}: {reason}' for run_id, reason in report.failed.items())
            raise AdoptionError(f'runs could not be converted, nothing was changed: {failures}')
    return replace(plan, runs=todo, already_adopted=held, copied=report)
