"""`step-persistence db adopt --store URL`: a SQLite or PostgreSQL database the harness wrote, converted in place.

On the harness's own data (tests/harness_data/): the dry run changes nothing, the adoption brings
every run into our tables in one transaction and keeps the harness's tables (renamed on SQLite),
a second adoption writes nothing, and one that fails leaves the database as it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from harness_data.checks import RawCounts, check_scenario, place_postgres, place_sqlite, sqlite_counts, tree_digest
from step_persistence import SqliteStepStore, from_spec
from step_persistence.adoption.in_place import AdoptionError, HarnessTablesNotFound, adopt, plan_adoption
from step_persistence.stores.sql.migrate import head_revision
from support.console_script import cli

pytestmark = pytest.mark.anyio

VERSION_TABLE = 'step_persistence_alembic_version'


@dataclass(frozen=True)
class Adoptable:
    url: str
    """Our URL of the database (`sqlite:///...`, `postgresql://...`)."""
    counts: RawCounts
    harness_runs_table: str
    """The harness's runs table once adopted."""


@pytest.fixture(params=['sqlite', 'postgres'])
async def adoptable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Adoptable]:
    if request.param == 'sqlite':
        database = place_sqlite(tmp_path / 'old.db')
        yield Adoptable(f'sqlite:///{database}', sqlite_counts(database), 'harness_runs')
        return
    server = request.getfixturevalue('postgres_server')
    name = await server.create_database()
    try:
        counts = await place_postgres(server.port, name)
        yield Adoptable(f'postgresql://postgres@127.0.0.1:{server.port}/{name}', counts, 'step_persistence_runs')
    finally:
        await server.drop_database(name)


def _engine(url: str) -> AsyncEngine:
    return create_async_engine(
        url.replace('sqlite://', 'sqlite+aiosqlite://').replace('postgresql://', 'postgresql+asyncpg://')
    )


async def _tables(url: str) -> dict[str, int]:
    """Every table of the database with its row count."""
    engine = _engine(url)
    try:
        async with engine.connect() as connection:
            names = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
            return {
                name: (await connection.execute(text(f'SELECT count(*) FROM "{name}"'))).scalar_one() for name in names
            }
    finally:
        await engine.dispose()


async def test_adoption_converts_in_place_once(adoptable: Adoptable) -> None:
    before = await _tables(adoptable.url)
    plan = await plan_adoption(adoptable.url)
    assert await _tables(adoptable.url) == before  # the dry run changed nothing
    assert (plan.revision, plan.head, len(plan.runs)) == (None, head_revision(), adoptable.counts.runs)

    done = await adopt(adoptable.url)
    assert done.copied is not None and len(done.copied.copied) == adoptable.counts.runs
    tables = await _tables(adoptable.url)
    assert tables[adoptable.harness_runs_table] == adoptable.counts.runs  # the harness's tables are kept
    assert tables['runs'] == adoptable.counts.runs
    assert VERSION_TABLE in tables
    async with from_spec(adoptable.url) as ours:
        await check_scenario(ours, adoptable.counts)

    again = await plan_adoption(adoptable.url)
    assert again.changes_nothing and len(again.already_adopted) == adoptable.counts.runs
    second = await adopt(adoptable.url)
    assert second.copied is not None and second.copied.copied == []
    assert await _tables(adoptable.url) == tables


async def test_a_failed_adoption_changes_nothing(adoptable: Adoptable) -> None:
    """A stored message the conversion cannot read fails the adoption: the renames, our tables and the runs
    copied before it are all rolled back."""
    messages = 'snapshot_messages' if adoptable.url.startswith('sqlite') else 'step_persistence_messages'
    engine = _engine(adoptable.url)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                text(f"UPDATE {messages} SET message = 'not json' WHERE sha256 = (SELECT max(sha256) FROM {messages})")
            )
    finally:
        await engine.dispose()
    before = await _tables(adoptable.url)
    with pytest.raises(AdoptionError, match='nothing was changed'):
        await adopt(adoptable.url)
    assert await _tables(adoptable.url) == before


async def test_a_database_without_harness_tables(tmp_path: Path) -> None:
    """Our own database holds nothing to adopt: not found (exit 3), and nothing changes."""
    url = f'sqlite:///{tmp_path / "ours.db"}'
    async with SqliteStepStore(tmp_path / 'ours.db') as ours:
        await ours.migrate()
    before = await _tables(url)
    with pytest.raises(HarnessTablesNotFound):
        await adopt(url)
    assert 'no pydantic-ai-harness tables' in cli('db', 'adopt', '--store', url, expect=3).stderr
    assert await _tables(url) == before


def test_the_command(tmp_path: Path) -> None:
    """`db adopt --dry-run` says what it would do and changes nothing; `db adopt` does it; again, nothing."""
    database = place_sqlite(tmp_path / 'old.db')
    url = f'sqlite:///{database}'
    before = tree_digest(database)
    dry = cli('db', 'adopt', '--store', url, '--dry-run')
    assert 'rename table runs to harness_runs' in dry.stdout
    assert f'create the step-persistence tables at revision {head_revision()}' in dry.stdout
    assert 'convert 8 run(s); 0 already adopted' in dry.stdout
    assert 'dry run: nothing was changed' in dry.stdout
    assert tree_digest(database) == before
    done = cli('db', 'adopt', '--store', url)
    assert 'adopted: 8 run(s) converted, 0 already there' in done.stdout
    assert 'already adopted: nothing was changed' in cli('db', 'adopt', '--store', url).stdout
    listed = cli('runs', 'list', '--store', url, '--json')
    assert listed.stdout.count('"run_id"') == 8
    assert 'does not exist' in cli('db', 'adopt', '--store', f'sqlite:///{tmp_path / "missing.db"}', expect=4).stderr
    assert 'is not one' in cli('db', 'adopt', '--store', 'mongodb://localhost/x', expect=2).stderr
