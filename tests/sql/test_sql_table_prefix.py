"""`table_prefix=`: a SQL store in a database the application shares, beside its own `messages` and `runs`
(issue 18, item 6), on SQLite and the session's real PostgreSQL server.

The conformance suite also runs on prefixed stores: tests/sql/test_sql_sessions.py (SQLite, an
application's session) and tests/sql/test_sql_psycopg.py (PostgreSQL, an application's psycopg
engine), each in a database that holds tables of the application named as the store's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessagesTypeAdapter
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import SqlStepStore, StepPersistence, continue_run, from_spec
from step_persistence.stores.sql import SchemaClash, SqliteStepStore, TableNames, table_names
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.database_store import SchemaNotReadyError
from step_persistence.stores.sql.migrate import downgrade, upgrade
from step_persistence.stores.sql.reporting import read_report
from support.console_script import cli
from support.databases import APPLICATION_TABLES, EmptyDatabase, create_application_tables
from support.scripted import calls, scripted
from support.scripted import text as answer

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
PREFIX = 'sp_'


async def execute(url: str, *statements: str) -> list[Any]:
    """Run `statements` in one transaction; the rows of the last one, if it returns any."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            result = None
            for statement in statements:
                result = await connection.execute(text(statement))
            return list(result) if result is not None and result.returns_rows else []
    finally:
        await engine.dispose()


async def application_rows(database: EmptyDatabase) -> tuple[list[Any], list[Any]]:
    return (
        [tuple(row) for row in await execute(database.url, 'SELECT id, body FROM messages')],
        [tuple(row) for row in await execute(database.url, 'SELECT id, label FROM runs')],
    )


def _differences(connection: Connection, names: TableNames) -> list[Any]:
    context = MigrationContext.configure(
        connection,
        opts={
            'compare_type': True,
            'compare_server_default': True,
            'version_table': names.version_table,
            'include_name': lambda name, type_, parents: type_ != 'table' or names.owns(name),
        },
    )
    return list(compare_metadata(context, names.metadata()))


async def schema_differences(database: EmptyDatabase, names: TableNames) -> list[Any]:
    engine = create_async_engine(database.url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(_differences, names)
    finally:
        await engine.dispose()


def agent(store: SqlStepStore) -> Agent[None, str]:
    model = scripted(calls(('lookup', {'city': 'Hue'})), answer('It is sunny in Hue.'))
    weather: Agent[None, str] = Agent(model, name='weather', capabilities=[StepPersistence(store=store)])

    @weather.tool_plain
    def lookup(city: str) -> str:
        return f'sunny in {city}'

    return weather


async def test_a_prefixed_store_keeps_to_its_own_names_beside_the_applications_tables(
    empty_database: EmptyDatabase,
) -> None:
    await create_application_tables(empty_database.url)
    before = await application_rows(empty_database)
    async with SqlStepStore(empty_database.url, table_prefix=PREFIX) as store:
        result = await agent(store).run('Weather in Hue?', conversation_id='chat')
        [run] = await store.list_runs()
        kinds = [event.kind for event in await store.list_events(run_id=run.run_id)]
        assert kinds[0] == 'run_started' and kinds[-1] == 'run_completed' and 'tool_call_completed' in kinds
        [effect] = await store.list_tool_effects(run_id=run.run_id)
        assert (effect.tool_name, effect.status) == ('lookup', 'completed')
        latest = await store.latest_snapshot(run_id=run.run_id)
        assert latest is not None and latest.state == 'complete'
        stored = ModelMessagesTypeAdapter.dump_python(latest.messages, mode='json')
        assert stored == ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode='json')
        continued = await continue_run(store, run_id=run.run_id)
        assert len(continued) == len(result.all_messages())
        [summary], [stats] = await read_report(store)
        assert (summary.run_id, summary.status, summary.tool_calls) == (run.run_id, 'completed', 1)
        assert (stats.tool_name, stats.calls) == ('lookup', 1)

    names = table_names(PREFIX)
    assert await application_rows(empty_database) == before
    assert await empty_database.table_names() == APPLICATION_TABLES | names.tables | {names.version_table}
    assert await empty_database.view_names() == {'sp_run_summary', 'sp_tool_call_stats'}
    assert await schema_differences(empty_database, names) == [], 'indexes and constraints as the migrations name them'


async def test_without_a_prefix_a_clash_is_refused_with_a_clear_error_and_nothing_is_created(
    empty_database: EmptyDatabase,
) -> None:
    await create_application_tables(empty_database.url)
    async with SqlStepStore(empty_database.url) as store:
        with pytest.raises(SchemaNotReadyError, match='holds tables named events, messages, runs') as read:
            await store.list_runs()
        assert 'table_prefix' in str(read.value) and "schema='steps'" in str(read.value)
        with pytest.raises(SchemaClash, match='already holds tables named events, messages, runs') as written:
            await agent(store).run('Weather in Hue?')
        assert 'table_prefix' in str(written.value)
    assert await empty_database.table_names() == APPLICATION_TABLES, 'the failed migration was rolled back'


def alembic(*args: str) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [sys.executable, '-m', 'alembic', *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return completed


async def test_alembic_migrates_a_prefixed_schema_both_ways_and_keeps_its_data(empty_database: EmptyDatabase) -> None:
    """`alembic -x table_prefix=sp_` upgrades to head; a chat stored there survives a downgrade to 0004 (the
    renumbering of revision 0005 on prefixed tables) and the upgrade back; `downgrade base` leaves the
    application's tables alone (the later migrations run from code, on the same environment)."""
    await create_application_tables(empty_database.url)
    url = empty_database.url.replace('+aiosqlite', '').replace('+asyncpg', '')
    alembic('-x', f'url={url}', '-x', f'table_prefix={PREFIX}', 'upgrade', 'head')
    names = table_names(PREFIX)
    assert await schema_differences(empty_database, names) == []

    async with SqlStepStore(empty_database.url, table_prefix=PREFIX, auto_migrate=False) as store:
        first = await agent(store).run('Weather in Hue?', conversation_id='chat')
        [run] = await store.list_runs()
        kept = await continue_run(store, run_id=run.run_id)
        await agent(store).run('And tomorrow?', message_history=kept, conversation_id='chat')
        histories = {
            each.run_id: ModelMessagesTypeAdapter.dump_python(snapshot.messages, mode='json')
            for each in await store.list_runs()
            if (snapshot := await store.latest_snapshot(run_id=each.run_id)) is not None
        }
    assert len(histories) == 2 and len(first.all_messages()) == 4

    database = Database.from_url(empty_database.url, table_prefix=PREFIX)
    try:
        await downgrade(database, '0004')
        [(per_run,)] = await execute(empty_database.url, 'SELECT count(DISTINCT run_id) FROM sp_messages')
        assert per_run == 2, 'revision 0004 numbers each run of the chat on its own'
        await upgrade(database)
    finally:
        await database.aclose()
    async with SqlStepStore(empty_database.url, table_prefix=PREFIX, auto_migrate=False) as store:
        for run_id, history in histories.items():
            snapshot = await store.latest_snapshot(run_id=run_id)
            assert snapshot is not None
            assert ModelMessagesTypeAdapter.dump_python(snapshot.messages, mode='json') == history

    database = Database.from_url(empty_database.url, table_prefix=PREFIX)
    try:
        await downgrade(database, 'base')
    finally:
        await database.aclose()
    assert await empty_database.table_names() == APPLICATION_TABLES | {names.version_table}
    assert await empty_database.view_names() == set()
    assert (await application_rows(empty_database))[0] == [(1, 'hello from the app')]


async def test_the_command_line_and_from_spec_take_the_prefix_from_the_url(tmp_path: Path) -> None:
    database = tmp_path / 'app.db'
    url = f'sqlite:///{database}?table_prefix={PREFIX}'
    await create_application_tables(f'sqlite+aiosqlite:///{database}')
    assert cli('db', 'upgrade', '--store', url).returncode == 0
    async with from_spec(url) as store:
        assert isinstance(store, SqliteStepStore)
        await agent(store).run('Weather in Hue?')
    [listed] = json.loads(cli('runs', 'list', '--store', url, '--json').stdout)
    assert listed['agent_name'] == 'weather' and listed['status'] == 'completed'
    assert 'lookup' in cli('report', '--store', url).stdout
    refused = cli('runs', 'list', '--store', f'sqlite:///{database}', expect=5)
    assert 'table_prefix' in refused.stderr, 'without the prefix: the clash, explained'


@pytest.mark.parametrize(
    ('prefix', 'error'),
    [(3, TypeError), ('SP_', ValueError), ('1x', ValueError), ('x' * 16, ValueError), ('sp-', ValueError)],
)
def test_a_prefix_that_cannot_start_every_name_is_refused(prefix: Any, error: type[Exception], tmp_path: Path) -> None:
    with pytest.raises(error, match='table_prefix'):
        SqliteStepStore(tmp_path / 'x.db', table_prefix=prefix)
    assert not (tmp_path / 'x.db').exists()
