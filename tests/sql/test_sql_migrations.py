"""The packaged Alembic migrations: the `alembic` command, the state-column upgrade, models vs. migrations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from sqlalchemy import Column, Integer, MetaData, Table, func, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore, from_spec
from step_persistence._history import encode_messages
from step_persistence.stores.sql import TABLE_NAMES, VERSION_TABLE, Base, include_name
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.migrate import upgrade
from step_persistence.stores.sql.schema import messages, runs, snapshots
from step_persistence.testing.conformance import sample_history
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
REPORTING_VIEWS = {'run_summary', 'tool_call_stats'}


def alembic(*args: str, env: dict[str, str] | None = None, succeed: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real `alembic` command from the repository root (where `alembic.ini` lives)."""
    completed = subprocess.run(
        [sys.executable, '-m', 'alembic', *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (completed.returncode == 0) == succeed, completed.stderr
    return completed


def dump(history: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(history, mode='json')


def plain(url: str) -> str:
    """The URL as a user would write it, without the async driver."""
    return url.replace('+aiosqlite', '').replace('+asyncpg', '')


async def scalar(url: str, statement: Any) -> Any:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return (await connection.execute(statement)).scalar_one()
    finally:
        await engine.dispose()


async def test_alembic_upgrade_head_and_downgrade_base(empty_database: EmptyDatabase) -> None:
    alembic('-x', f'url={plain(empty_database.url)}', 'upgrade', 'head')
    assert await empty_database.table_names() == TABLE_NAMES | {VERSION_TABLE}
    assert await empty_database.view_names() == REPORTING_VIEWS
    assert await scalar(empty_database.url, text(f'SELECT version_num FROM {VERSION_TABLE}')) == '0004'

    alembic('downgrade', 'base', env={'STEP_PERSISTENCE_DATABASE_URL': plain(empty_database.url)})
    assert await empty_database.table_names() == {VERSION_TABLE}
    assert await empty_database.view_names() == set()


async def test_alembic_upgrade_into_a_postgres_schema(postgres_database: EmptyDatabase) -> None:
    alembic('-x', f'url={postgres_database.url}', '-x', 'schema=steps', 'upgrade', 'head')
    assert await postgres_database.table_names(schema='steps') == TABLE_NAMES | {VERSION_TABLE}
    assert await postgres_database.table_names() == set()
    async with SqlStepStore(postgres_database.url, schema='steps', auto_migrate=False) as store:
        await store.register_run(RunRecord(run_id='in-schema'))
        assert [run.run_id for run in await store.list_runs()] == ['in-schema']


def test_alembic_without_a_url_says_how_to_give_one() -> None:
    env = {'STEP_PERSISTENCE_DATABASE_URL': ''}
    completed = alembic('upgrade', 'head', env=env, succeed=False)
    assert '-x url=' in completed.stderr and 'STEP_PERSISTENCE_DATABASE_URL' in completed.stderr


def test_alembic_offline_mode_prints_the_sql(tmp_path: Path) -> None:
    completed = alembic('-x', f'url=sqlite:///{tmp_path / "never-created.db"}', 'upgrade', 'head', '--sql')
    assert 'CREATE TABLE runs' in completed.stdout
    assert "ADD COLUMN state VARCHAR DEFAULT 'complete' NOT NULL" in completed.stdout
    assert f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('0001')" in completed.stdout
    assert not (tmp_path / 'never-created.db').exists()


async def test_snapshots_from_before_the_state_column_read_back_complete(empty_database: EmptyDatabase) -> None:
    database = Database.from_url(empty_database.url)
    history = sample_history(2, tag='old')
    try:
        await upgrade(database, '0001')

        def write_old_rows(transaction: Transaction) -> None:
            connection = transaction.connection
            assert 'state' not in Table('snapshots', MetaData(), autoload_with=connection).c
            connection.execute(
                runs.insert().values(
                    run_id='old',
                    metadata={},
                    started_at=func.current_timestamp(),
                    last_snapshot_seq=2,
                    last_message_no=len(history),
                )
            )
            encoded = encode_messages(history)
            connection.execute(
                messages.insert(),
                [
                    {
                        'run_id': 'old',
                        'no': position + 1,
                        'position': position,
                        'digest': message.digest,
                        'body': message.data,
                        'externalized': False,
                    }
                    for position, message in enumerate(encoded)
                ],
            )
            for seq, length in ((1, 3), (2, len(history))):
                connection.execute(
                    snapshots.insert().values(
                        run_id='old',
                        seq=seq,
                        step_index=seq,
                        timestamp=func.current_timestamp(),
                        history_length=length,
                        through_message=length,
                    )
                )

        await database.run(write_old_rows, write=True)
        await upgrade(database)
    finally:
        await database.aclose()

    async with SqlStepStore(empty_database.url) as store:
        latest = await store.latest_snapshot(run_id='old')
        assert latest is not None
        assert (latest.seq, latest.state) == (2, 'complete')
        assert dump(latest.messages) == dump(history)
        assert [s.state for s in await store.list_snapshots(run_id='old')] == ['complete', 'complete']
        await store.save_snapshot(
            ContinuableSnapshot(run_id='old', step_index=3, messages=history, state='interrupted')
        )
        newest = await store.latest_snapshot(run_id='old', include_interrupted=True)
        assert newest is not None and (newest.seq, newest.state) == (3, 'interrupted')


def _differences(connection: Connection, metadata: MetaData, **options: Any) -> list[Any]:
    context = MigrationContext.configure(
        connection,
        opts={'compare_type': True, 'compare_server_default': True, 'version_table': VERSION_TABLE, **options},
    )
    return list(compare_metadata(context, metadata))


async def test_migrations_and_models_agree(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.migrate()
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.connect() as connection:
            assert await connection.run_sync(_differences, Base.metadata) == []
    finally:
        await engine.dispose()


async def test_an_applications_autogenerate_ignores_our_tables(empty_database: EmptyDatabase) -> None:
    app = MetaData()
    Table('orders', app, Column('id', Integer, primary_key=True))
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(app.create_all)
        async with SqlStepStore(engine) as store:
            await store.migrate()
        async with engine.connect() as connection:
            assert await connection.run_sync(_differences, app, include_name=include_name) == []
            unfiltered = await connection.run_sync(_differences, app)
        assert {diff[1].name for diff in unfiltered if diff[0] == 'remove_table'} == set(TABLE_NAMES)
    finally:
        await engine.dispose()


async def test_stores_starting_together_in_several_processes_migrate_once(postgres_database: EmptyDatabase) -> None:
    from support.processes import write_concurrently

    spec = {'backend': postgres_database.url, 'schema': 'concurrent'}
    write_concurrently(spec, [f'p{number}' for number in range(3)], count=2)
    async with from_spec(**spec) as store:
        assert len(await store.list_runs()) == 6
        for run in await store.list_runs():
            assert len(await store.list_snapshots(run_id=run.run_id)) == 2
    version = text(f'SELECT count(*) FROM concurrent.{VERSION_TABLE}')
    assert await scalar(postgres_database.url, version) == 1
    assert await postgres_database.table_names(schema='concurrent') == TABLE_NAMES | {VERSION_TABLE}


async def test_upgrading_a_current_database_changes_nothing(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='kept'))
    async with SqlStepStore(empty_database.url) as store:
        await store.migrate()
        assert [run.run_id for run in await store.list_runs()] == ['kept']
    assert await scalar(empty_database.url, select(func.count()).select_from(runs)) == 1
