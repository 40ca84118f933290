"""The schema's partial unique indexes, declared once (`schema._unique_where`), keep their predicate on both
dialects without SQLAlchemy's PostgreSQL dialect being imported to declare them (issue 18, item 5).

Alembic's comparison of the schema with the migrations (tests/sql/test_sql_migrations.py) does not
compare index predicates, so this checks them: the DDL built from the schema, as the migrations and
Alembic's autogenerate see it (`TableNames.metadata()`, also under a table prefix), has each predicate,
and on a migrated database an index holds only the rows its predicate names.
"""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql.elements import TextClause

from step_persistence import SqlStepStore
from step_persistence.stores.sql import TABLES, table_names
from support.databases import EmptyDatabase

PREDICATES = {
    'uq_runs_origin_run_id_origin_seq': "origin_kind = 'continued'",
    'uq_events_run_id_idempotency_key': 'idempotency_key IS NOT NULL',
}
"""Every partial index of the schema, and its predicate."""


def predicates(dialect: Dialect, prefix: str) -> dict[str, str]:
    """Each index of the schema under `prefix` whose `CREATE INDEX` on `dialect` has a `WHERE`, and that predicate."""
    found: dict[str, str] = {}
    for table in table_names(prefix).metadata().tables.values():
        for index in table.indexes:
            ddl = str(CreateIndex(index).compile(dialect=dialect))
            if ' WHERE ' in ddl:
                found[str(index.name)] = ddl.split(' WHERE ', 1)[1].strip()
    return found


@pytest.mark.parametrize('dialect', [sqlite.dialect(), postgresql.dialect()], ids=lambda dialect: dialect.name)
@pytest.mark.parametrize('prefix', ['', 'app_'])
def test_the_ddl_of_each_partial_index_has_its_predicate(dialect: Dialect, prefix: str) -> None:
    names = table_names(prefix)
    assert predicates(dialect, prefix) == {names.object(name): where for name, where in PREDICATES.items()}


def test_the_declared_schema_has_its_sqlite_predicates() -> None:
    declared = {
        str(index.name): str(index.dialect_options['sqlite']['where'])
        for table in TABLES.tables.values()
        for index in table.indexes
        if index.dialect_options['sqlite']['where'] is not None
    }
    assert declared == PREDICATES


def test_declaring_the_schema_imports_no_postgresql_dialect() -> None:
    probe = 'import sys, step_persistence.stores.sql.schema; print("sqlalchemy.dialects.postgresql" in sys.modules)'
    completed = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == 'False'


def insert_run(run_id: str, kind: str) -> TextClause:
    """A run stored as `kind` (`continued` or `forked`) from snapshot 1 of run `origin`."""
    return text(
        'INSERT INTO runs (run_id, metadata, started_at, origin_kind, origin_run_id, origin_seq) '
        f"VALUES ('{run_id}', '{{}}', '2026-01-01 00:00:00', '{kind}', 'origin', 1)"
    )


@pytest.mark.anyio
async def test_a_migrated_database_applies_the_predicate(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.migrate()
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.begin() as connection:
            for run_id in ('fork-1', 'fork-2', 'continuation'):  # forks of one snapshot are outside the index
                await connection.execute(insert_run(run_id, 'continued' if run_id == 'continuation' else 'forked'))
        async with engine.begin() as connection:
            with pytest.raises(IntegrityError):
                await connection.execute(insert_run('second-continuation', 'continued'))
    finally:
        await engine.dispose()


CREATE_ALL = """
import asyncio, sys
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from step_persistence.stores.sql import TABLES

async def main() -> None:
    engine = create_async_engine(sys.argv[1])
    async with engine.begin() as connection:
        await connection.run_sync(TABLES.create_all)
        rows = await connection.execute(
            text("SELECT indexname, indexdef FROM pg_indexes WHERE indexdef LIKE '% WHERE %' ORDER BY indexname")
        )
        for name, definition in rows:
            print(name, definition.split(' WHERE ', 1)[1])
    await engine.dispose()

asyncio.run(main())
"""
"""`TABLES.create_all` on the PostgreSQL database at argv[1], in a new interpreter (nothing has declared the
PostgreSQL predicates before), printing each partial index created and its predicate."""


@pytest.mark.anyio
async def test_create_all_on_postgresql_makes_the_partial_indexes(postgres_database: EmptyDatabase) -> None:
    completed = await anyio.run_process([sys.executable, '-c', CREATE_ALL, postgres_database.url])
    assert completed.stdout.decode().splitlines() == [
        'uq_events_run_id_idempotency_key (idempotency_key IS NOT NULL)',
        "uq_runs_origin_run_id_origin_seq ((origin_kind)::text = 'continued'::text)",
    ]
