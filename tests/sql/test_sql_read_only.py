"""Reading never writes: a SQL store whose first operations are reads creates and migrates nothing.

A database that holds no tables yet (a SQLite file that does not exist, a PostgreSQL database or
schema without them) is an empty store: reads find nothing. Tables at another revision make reads
raise `SchemaNotReadyError`, naming `step-persistence db upgrade`; the first write of a store that
migrates automatically still creates or upgrades them.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import PostgresStepStore, RunRecord, SqliteStepStore, SqlStepStore, from_spec
from step_persistence.media import SqlMediaStore
from step_persistence.reclaiming import MediaCollection
from step_persistence.stores.sql import VERSION_TABLE
from step_persistence.stores.sql.database_store import HEAD_REVISION, SCHEMA_REVISIONS, SchemaNotReadyError
from step_persistence.stores.sql.migrate import alembic_config, current, downgrade
from step_persistence.stores.sql.reporting import read_report
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio

Read = Callable[[SqlStepStore], Awaitable[Any]]

READS: dict[str, Read] = {
    'get_run': lambda store: store.get_run(run_id='r'),
    'list_runs': lambda store: store.list_runs(),
    'list_runs(conversation_id)': lambda store: store.list_runs(conversation_id='c', newest_first=True, limit=5),
    'list_runs(parent_run_id)': lambda store: store.list_runs(parent_run_id='r'),
    'list_conversations': lambda store: store.list_conversations(),
    'find_snapshot': lambda store: store.find_snapshot(conversation_id='c', history_digest='d'),
    'list_events': lambda store: store.list_events(run_id='r'),
    'latest_snapshot': lambda store: store.latest_snapshot(run_id='r', include_interrupted=True),
    'list_snapshots': lambda store: store.list_snapshots(run_id='r'),
    'get_tool_effect': lambda store: store.get_tool_effect(run_id='r', tool_call_id='call'),
    'list_tool_effects': lambda store: store.list_tool_effects(run_id='r'),
    'list_unresolved_tool_effects': lambda store: store.list_unresolved_tool_effects(run_id='r'),
    'runs_started_before': lambda store: store.runs_started_before(datetime.now(UTC)),
    'prune_runs': lambda store: store.prune_runs(older_than=datetime.now(UTC)),
    'read_report': read_report,
}
"""Every read of the protocol (and pruning, which reads before it deletes), with what it finds in an empty store."""

NOTHING: dict[str, Any] = {
    **{
        name: None if name in ('get_run', 'find_snapshot', 'latest_snapshot', 'get_tool_effect') else []
        for name in READS
    },
    'read_report': ([], []),
}


def record(run_id: str = 'r') -> RunRecord:
    return RunRecord(run_id=run_id, agent_name='librarian', conversation_id='c')


async def sql(url: str, statement: str) -> list[Any]:
    """The rows of `statement` run on its own engine (committed)."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            result = await connection.execute(text(statement))
            return list(result.all()) if result.returns_rows else []
    finally:
        await engine.dispose()


def touch(path: str) -> None:
    Path(path).touch()


def exists(path: Path) -> bool:
    return path.exists()


def every_file(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob('*'))


async def finds_nothing(store: SqlStepStore) -> None:
    found = {name: await read(store) for name, read in READS.items()}
    assert found == NOTHING
    assert await store.has_schema() is False
    assert await store.collect_media(grace=timedelta(0)) == MediaCollection(messages=0, blobs=0)
    await store.delete_run(run_id='r', cascade=True)
    with pytest.raises(SchemaNotReadyError, match='no step-persistence tables') as raised:
        await store.ready_database()
    assert raised.value.upgradable and 'step-persistence db upgrade' in str(raised.value)


@pytest.mark.parametrize(
    'open_store',
    [
        lambda path: SqliteStepStore(path),
        lambda path: SqlStepStore(f'sqlite:///{path}'),
        lambda path: from_spec(f'sqlite:///{path}'),
        lambda path: SqliteStepStore(path, auto_migrate=False),
    ],
    ids=['SqliteStepStore', 'SqlStepStore-url', 'from_spec', 'no-auto-migrate'],
)
async def test_reading_a_sqlite_file_that_does_not_exist_creates_nothing(
    tmp_path: Path, open_store: Callable[[Path], Any]
) -> None:
    path = tmp_path / 'missing' / 'deeper' / 'runs.db'
    async with open_store(path) as store:
        assert isinstance(store, SqlStepStore)
        found = {name: await read(store) for name, read in READS.items()}
        assert found == NOTHING
        assert await store.collect_media(grace=timedelta(0)) == MediaCollection(messages=0, blobs=0)
        await store.delete_run(run_id='r')
        assert await store.has_schema() is False
    assert every_file(tmp_path) == [], 'neither the file nor its directories'


async def test_the_first_write_still_creates_the_file_and_its_directories(tmp_path: Path) -> None:
    path = tmp_path / 'missing' / 'deeper' / 'runs.db'
    async with SqliteStepStore(path) as store:
        assert await store.list_runs() == []
        await store.register_run(record())
        assert [run.run_id for run in await store.list_runs()] == ['r']
        assert await store.has_schema() is True
    assert exists(path)
    assert await current_revision(f'sqlite+aiosqlite:///{path}') == HEAD_REVISION


async def current_revision(url: str, schema: str | None = None) -> str | None:
    async with SqlStepStore(url, schema=schema, auto_migrate=False) as store:
        return await current(await store.ready_database())


async def test_reading_a_database_without_tables_creates_nothing(empty_database: EmptyDatabase, tmp_path: Path) -> None:
    if empty_database.dialect == 'sqlite':
        touch(empty_database.url.removeprefix('sqlite+aiosqlite:///'))  # an empty file: no tables
    before = every_file(tmp_path)
    async with SqlStepStore(empty_database.url) as store:
        await finds_nothing(store)
    assert await empty_database.table_names() == set()
    assert every_file(tmp_path) == before
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(record())
        assert [run.run_id for run in await store.list_runs()] == ['r'], 'the first write migrates, as before'


async def test_reading_a_postgres_schema_that_does_not_exist_creates_nothing(
    postgres_database: EmptyDatabase,
) -> None:
    async with PostgresStepStore(postgres_database.url, schema='steps') as store:
        await finds_nothing(store)
    assert await sql(postgres_database.url, "select 1 from pg_namespace where nspname = 'steps'") == []
    async with from_spec(f'{postgres_database.url}?schema=steps') as store:
        await store.register_run(record())
    async with PostgresStepStore(postgres_database.url, schema='steps') as store:
        assert await store.has_schema() is True
        assert [run.run_id for run in await store.list_runs()] == ['r']
    assert await postgres_database.table_names() == set(), 'the tables went to the schema'


async def an_old_database(url: str, revision: str = '0004') -> None:
    """A database with one run, then downgraded to `revision`."""
    async with SqlStepStore(url) as store:
        await store.register_run(record('old'))
        await downgrade(await store.ready_database(), revision)


async def test_reading_an_older_revision_says_how_to_upgrade_and_migrates_nothing(
    empty_database: EmptyDatabase,
) -> None:
    await an_old_database(empty_database.url)
    async with SqlStepStore(empty_database.url) as store:
        for name, read in READS.items():
            with pytest.raises(SchemaNotReadyError) as raised:
                await read(store)
            error = raised.value
            assert error.revision == '0004' and error.upgradable, name
            assert 'revision 0004' in str(error) and 'step-persistence db upgrade' in str(error), name
        with pytest.raises(SchemaNotReadyError, match='0004'):
            await store.has_schema()
        with pytest.raises(SchemaNotReadyError, match='0004'):
            await store.ready_database()
    assert await current_revision(empty_database.url) == '0004', 'no read migrated it'

    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(record('new'))  # a write upgrades, as auto_migrate always did
        assert [run.run_id for run in await store.list_runs()] == ['old', 'new']
    assert await current_revision(empty_database.url) == HEAD_REVISION


async def test_deleting_from_an_older_revision_upgrades_it(empty_database: EmptyDatabase) -> None:
    """Deleting is a write: it upgrades tables it finds at an older revision (only an empty store is left alone)."""
    await an_old_database(empty_database.url)
    async with SqlStepStore(empty_database.url) as store:
        await store.delete_run(run_id='old')
        assert await store.list_runs() == []
    assert await current_revision(empty_database.url) == HEAD_REVISION


async def test_a_read_waits_for_a_migration_the_same_process_started(empty_database: EmptyDatabase) -> None:
    """A read started while a write of the same store upgrades the tables reads the upgraded tables (rather
    than the older revision, which it would refuse)."""
    await an_old_database(empty_database.url)
    async with SqlStepStore(empty_database.url) as store:
        _, listed = await asyncio.gather(store.register_run(record('new')), store.list_runs())
        assert [run.run_id for run in listed] in (['old'], ['old', 'new'])
        assert [run.run_id for run in await store.list_runs()] == ['old', 'new']


async def test_a_revision_from_a_newer_version_is_not_read(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(record())
    await sql(empty_database.url, f"update {VERSION_TABLE} set version_num = '0099'")
    async with SqlStepStore(empty_database.url) as store:
        with pytest.raises(SchemaNotReadyError, match='newer version') as raised:
            await store.list_runs()
    assert raised.value.revision == '0099' and not raised.value.upgradable


async def test_tables_without_a_recorded_revision_are_not_taken_for_an_empty_store(
    empty_database: EmptyDatabase,
) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(record())
    await sql(empty_database.url, f'delete from {VERSION_TABLE}')
    async with SqlStepStore(empty_database.url) as store:
        with pytest.raises(SchemaNotReadyError, match='records no schema revision') as raised:
            await store.get_run(run_id='r')
    assert raised.value.revision is None and 'db stamp' in str(raised.value)


async def test_without_auto_migrate_reads_are_not_checked(empty_database: EmptyDatabase) -> None:
    """`auto_migrate=False` leaves the schema to the caller: reads run as they are (a missing table is the
    database's error), and only a SQLite file that does not exist is known to hold nothing."""
    await an_old_database(empty_database.url, '0002')
    async with SqlStepStore(empty_database.url, auto_migrate=False) as store:
        with pytest.raises(Exception) as raised:  # noqa: PT011 (the driver's error for a missing table)
            await store.list_conversations()
    assert not isinstance(raised.value, SchemaNotReadyError)
    assert await current_revision(empty_database.url) == '0002'


def test_the_revisions_are_the_migrations() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    walked = [revision.revision for revision in reversed(list(script.walk_revisions()))]
    assert walked == list(SCHEMA_REVISIONS)
    assert script.get_current_head() == HEAD_REVISION


async def test_a_media_store_of_its_own_reads_without_creating_or_migrating(
    empty_database: EmptyDatabase, tmp_path: Path
) -> None:
    missing = tmp_path / 'nothing-here' / 'media.db'
    for url in (f'sqlite:///{missing}', empty_database.url):
        async with SqlMediaStore(url) as media:
            assert [blob async for blob in media.list_blobs()] == []
            assert await media.exists('media+sha256://' + '0' * 64) is False
            with pytest.raises(FileNotFoundError):
                await media.get('media+sha256://' + '0' * 64)
    assert not missing.parent.exists()
    assert await empty_database.table_names() == set()
    await an_old_database(empty_database.url)
    async with SqlMediaStore(empty_database.url) as media:
        with pytest.raises(SchemaNotReadyError, match='0004'):
            await media.exists('media+sha256://' + '0' * 64)
        uri = await media.put(b'bytes')  # a write upgrades
        assert await media.get(uri) == b'bytes'


async def test_reads_leave_a_sqlite_file_as_they_found_it_even_its_journal_mode(tmp_path: Path) -> None:
    path = tmp_path / 'app.db'
    async with SqliteStepStore(path) as store:
        await store.register_run(record('kept'))
    with sqlite3.connect(path) as connection:  # an application's file, in the default rollback-journal mode
        assert connection.execute('PRAGMA journal_mode = DELETE').fetchone() == ('delete',)
    before = path.read_bytes()
    async with SqliteStepStore(path) as store:
        assert [run.run_id for run in await store.list_runs()] == ['kept']
        assert await store.get_run(run_id='kept') is not None
    assert path.read_bytes() == before, 'reading wrote nothing, not even the journal mode'
    async with SqliteStepStore(path) as store:
        await store.register_run(record('new'))  # the store's first write switches the file to WAL
    with sqlite3.connect(path) as connection:
        assert connection.execute('PRAGMA journal_mode').fetchone() == ('wal',)
