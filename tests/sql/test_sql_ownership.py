"""Who owns what: a caller's engine, connection or sqlite3 connection, and the store's own engine."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from step_persistence import (
    ContinuableSnapshot,
    RunRecord,
    SqliteStepStore,
    SqlStepStore,
    StepEvent,
    StepStore,
    ToolEffectRecord,
)
from step_persistence.stores.sql.schema import events, messages, runs, snapshots, tool_effects
from step_persistence.testing.conformance import sample_history
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio


async def write_a_run(store: StepStore, run_id: str) -> None:
    await store.register_run(RunRecord(run_id=run_id))
    await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='start'))
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, messages=sample_history(1)))
    await store.record_tool_effect(ToolEffectRecord(run_id=run_id, tool_call_id='t', tool_name='x', status='started'))


def has_wal(database: Path) -> bool:
    return database.with_name(f'{database.name}-wal').exists()


async def row_counts(engine: AsyncEngine) -> list[int]:
    async with engine.connect() as connection:
        return [
            (await connection.execute(select(func.count()).select_from(table))).scalar_one()
            for table in (runs, events, snapshots, messages, tool_effects)
        ]


async def test_a_shared_engine_is_used_and_never_disposed(empty_database: EmptyDatabase) -> None:
    engine = create_async_engine(empty_database.url)
    try:
        async with SqlStepStore(engine) as store:
            await write_a_run(store, 'shared')
        other = create_async_engine(empty_database.url)
        try:
            assert await row_counts(other) == [1, 1, 1, 3, 1]
        finally:
            await other.dispose()
        assert await row_counts(engine) == [1, 1, 1, 3, 1], 'the store disposed of an engine it does not own'
    finally:
        await engine.dispose()


async def test_a_connection_in_an_open_transaction_is_left_to_the_caller(empty_database: EmptyDatabase) -> None:
    engine = create_async_engine(empty_database.url)
    try:
        async with SqlStepStore(engine) as setup:
            await setup.migrate()
        async with engine.connect() as connection:
            transaction = await connection.begin()
            async with SqlStepStore(connection) as store:
                await write_a_run(store, 'uncommitted')
                assert [run.run_id for run in await store.list_runs()] == ['uncommitted']
            assert connection.in_transaction() and not connection.closed
            observer = create_async_engine(empty_database.url)
            try:
                assert await row_counts(observer) == [0, 0, 0, 0, 0], 'the store committed the caller transaction'
                await transaction.rollback()
                assert await row_counts(observer) == [0, 0, 0, 0, 0]

                async with connection.begin():
                    await write_a_run(SqlStepStore(connection), 'committed-by-caller')
                assert await row_counts(observer) == [1, 1, 1, 3, 1]
            finally:
                await observer.dispose()
    finally:
        await engine.dispose()


async def test_a_sqlite3_connection_is_committed_after_each_operation_and_left_open(tmp_path: Path) -> None:
    path = tmp_path / 'app.db'
    connection = sqlite3.connect(path, check_same_thread=False)
    try:
        assert connection.isolation_level == '', 'a default-mode (legacy transaction control) connection'
        async with SqliteStepStore(connection=connection) as store:
            await write_a_run(store, 'visible')
            assert not connection.in_transaction
            other = sqlite3.connect(path)
            try:
                assert other.execute('SELECT run_id FROM runs').fetchall() == [('visible',)]
                assert other.execute('SELECT count(*) FROM snapshots').fetchone() == (1,)
            finally:
                other.close()
        assert connection.execute('SELECT count(*) FROM events').fetchone() == (1,), 'the connection stays open'
        assert not connection.in_transaction
    finally:
        connection.close()


async def test_an_owned_sqlite_engine_uses_wal_and_is_released_on_close(tmp_path: Path) -> None:
    path = tmp_path / 'owned.db'
    store = SqliteStepStore(path)
    await asyncio.gather(*(write_a_run(store, f'run-{number}') for number in range(10)))
    assert has_wal(path)
    await store.aclose()
    assert not has_wal(path), 'closing the last connection checkpoints and removes the WAL'
    with sqlite3.connect(path) as check:
        assert check.execute('PRAGMA journal_mode').fetchone() == ('wal',)
        assert check.execute('SELECT count(*) FROM runs').fetchone() == (10,)


async def test_the_default_database_is_runs_db_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with SqliteStepStore() as store:
        await write_a_run(store, 'here')
    with sqlite3.connect(tmp_path / 'runs.db') as check:
        assert check.execute('SELECT run_id FROM runs').fetchall() == [('here',)]


async def test_an_in_memory_database_serves_concurrent_operations() -> None:
    async with SqliteStepStore(':memory:') as store:
        await asyncio.gather(*(write_a_run(store, f'run-{number}') for number in range(20)))
        assert len(await store.list_runs()) == 20
        assert all([len(await store.list_events(run_id=f'run-{number}')) == 1 for number in range(20)])
