"""An application's psycopg 3 engine (`postgresql+psycopg://`) shared with the SQL store, on the real server.

The whole conformance suite runs on `SqlStepStore(psycopg_engine, table_prefix='sp_')` (beside the
application's own `messages` and `runs`); the focused tests below check
what differs from asyncpg: every statement goes through Core (the application's engine events
see it), the stored rows are the ones an asyncpg store writes and reads, a caller's psycopg
connection or session keeps the store's writes in its transaction, PostgreSQL's refusals become
the same errors, and a cancelled operation leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, UserPromptPart
from sqlalchemy import event, func, inspect, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from step_persistence import (
    ContinuableSnapshot,
    PostgresStepStore,
    RunRecord,
    SqlStepStore,
    StepEvent,
    StepStore,
    ToolEffectRecord,
    classify_error,
)
from step_persistence.stores.sql.schema import events, media, messages, runs, snapshots, tool_effects
from step_persistence.testing import StepStoreConformance
from step_persistence.testing.conformance import StoreFactory, sample_history
from support.backends import postgres_template
from support.databases import wait_until_a_connection_waits_for_a_lock
from support.servers import free_port
from support.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio


def psycopg_url(server: PostgresServer, database: str) -> str:
    return server.url(database).replace('+asyncpg', '+psycopg')


class PsycopgDatabases:
    """Fresh migrated databases on the session's cluster, and psycopg engines on them; all gone at the end."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.names: list[str] = []
        self.engines: list[AsyncEngine] = []

    async def fresh(self, *, table_prefix: str = '') -> str:
        template = await postgres_template(self.server, table_prefix=table_prefix)
        self.names.append(await self.server.create_database(template=template))
        return self.names[-1]

    def engine(self, database: str) -> AsyncEngine:
        self.engines.append(create_async_engine(psycopg_url(self.server, database)))
        return self.engines[-1]

    async def close(self) -> None:
        for engine in self.engines:
            await engine.dispose()
        for name in self.names:
            await self.server.drop_database(name)


@pytest.fixture
async def databases(postgres_server: PostgresServer) -> AsyncIterator[PsycopgDatabases]:
    databases = PsycopgDatabases(postgres_server)
    try:
        yield databases
    finally:
        await databases.close()


class TestConformanceOnAPsycopgEngine(StepStoreConformance):
    """The whole suite on `SqlStepStore(engine, table_prefix='sp_')`, the engine an application's psycopg 3
    `AsyncEngine` on a database that also holds the application's own `messages`, `runs` and `events`."""

    @pytest.fixture
    async def make_store(self, databases: PsycopgDatabases) -> AsyncIterator[StoreFactory]:
        stores: list[StepStore] = []

        async def make(**options: Any) -> StepStore:
            engine = databases.engine(await databases.fresh(table_prefix='sp_'))
            assert engine.dialect.driver == 'psycopg'
            store = SqlStepStore(engine, table_prefix='sp_', **options)
            stores.append(store)
            return store

        try:
            yield make
        finally:
            for store in stores:
                await store.aclose()


async def write_a_run(store: StepStore, run_id: str, *, payload: bytes = b'\x00\xff' * 8) -> None:
    await store.register_run(RunRecord(run_id=run_id, conversation_id='chat', metadata={'tenant': 'seven'}))
    await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='start'))
    history = [
        *sample_history(2, tag=run_id),
        ModelRequest(parts=[UserPromptPart(content=['big', BinaryContent(data=payload, media_type='image/png')])]),
    ]
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, messages=history))
    await store.record_tool_effect(
        ToolEffectRecord(run_id=run_id, tool_call_id='t', tool_name='send', status='completed', effect_summary='sent')
    )


async def read_a_run(store: StepStore, run_id: str) -> tuple[Any, ...]:
    return (
        await store.get_run(run_id=run_id),
        await store.list_events(run_id=run_id),
        await store.list_snapshots(run_id=run_id, include_interrupted=True),
        await store.get_tool_effect(run_id=run_id, tool_call_id='t'),
    )


async def row_counts(engine: AsyncEngine) -> list[int]:
    async with engine.connect() as connection:
        return [
            (await connection.execute(select(func.count()).select_from(table))).scalar_one()
            for table in (runs, events, snapshots, messages, tool_effects, media)
        ]


async def test_asyncpg_and_psycopg_stores_read_each_others_rows(databases: PsycopgDatabases) -> None:
    name = await databases.fresh()
    psycopg_store = SqlStepStore(databases.engine(name), media_threshold_bytes=1024)
    async with PostgresStepStore(databases.server.url(name), media_threshold_bytes=1024) as asyncpg_store:
        await write_a_run(psycopg_store, 'by-psycopg', payload=b'\x01' * 4096)
        await write_a_run(asyncpg_store, 'by-asyncpg', payload=b'\x02' * 4096)
        for run_id in ('by-psycopg', 'by-asyncpg'):
            written = await read_a_run(psycopg_store if run_id == 'by-psycopg' else asyncpg_store, run_id)
            assert written[0] is not None and len(written[2]) == 1 and written[3] is not None
            assert await read_a_run(asyncpg_store, run_id) == written
            assert await read_a_run(psycopg_store, run_id) == written
        [snapshot] = written[2]
        assert snapshot.messages[-1].parts[0].content[1].data == b'\x02' * 4096
    # media: the two payloads and the sample history's image, which both runs share
    assert await row_counts(databases.engines[0]) == [2, 2, 2, 12, 2, 3]


async def test_every_statement_goes_through_the_applications_engine(databases: PsycopgDatabases) -> None:
    engine = databases.engine(await databases.fresh())
    sent: list[str] = []

    @event.listens_for(engine.sync_engine, 'before_cursor_execute')
    def collect(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(' '.join(statement.split()[:3]).upper())

    async with SqlStepStore(engine) as store:
        await write_a_run(store, 'seen')
    for table in ('runs', 'events', 'messages', 'snapshots', 'media', 'tool_effects'):
        assert f'INSERT INTO {table.upper()}' in sent, f'the insert into {table} reaches Core: {sent}'
    assert await row_counts(engine) == [1, 1, 1, 6, 1, 1]


async def test_a_psycopg_connection_keeps_the_writes_in_the_callers_transaction(databases: PsycopgDatabases) -> None:
    engine = databases.engine(await databases.fresh())
    async with engine.connect() as connection:
        transaction = await connection.begin()
        await write_a_run(SqlStepStore(connection), 'tentative')
        assert connection.in_transaction()
        assert await row_counts(databases.engine(databases.names[0])) == [0] * 6, 'nothing committed yet'
        await transaction.rollback()
        async with connection.begin():
            await write_a_run(SqlStepStore(connection), 'kept')
    assert await row_counts(engine) == [1, 1, 1, 6, 1, 1]
    assert (await SqlStepStore(engine).get_run(run_id='tentative')) is None


async def test_a_psycopg_session_keeps_the_writes_in_its_transaction(databases: PsycopgDatabases) -> None:
    engine = databases.engine(await databases.fresh())
    async with AsyncSession(engine) as session:
        store = SqlStepStore(session)
        await write_a_run(store, 'rolled-back')
        await session.rollback()
        await write_a_run(store, 'committed')
        assert await row_counts(databases.engine(databases.names[0])) == [0] * 6, 'the store never commits'
        await session.commit()
    assert [run.run_id for run in await SqlStepStore(engine).list_runs()] == ['committed']
    assert await row_counts(engine) == [1, 1, 1, 6, 1, 1]


async def test_a_nul_character_is_refused_with_nothing_written(databases: PsycopgDatabases) -> None:
    engine = databases.engine(await databases.fresh())
    async with SqlStepStore(engine) as store:
        with pytest.raises(ValueError, match='NUL'):
            await store.register_run(RunRecord(run_id='a\x00b'))
        await store.register_run(RunRecord(run_id='clean'))
        with pytest.raises(ValueError, match='NUL'):
            await store.append_event(StepEvent(run_id='clean', kind='run_started', step_index=0, error='x\x00'))
        assert await store.list_events(run_id='clean') == []
    assert await row_counts(engine) == [1, 0, 0, 0, 0, 0]


async def test_an_unreachable_server_is_classified_unreachable() -> None:
    engine = create_async_engine(f'postgresql+psycopg://postgres@127.0.0.1:{free_port()}/runs')  # nobody listens
    try:
        with pytest.raises(OperationalError, match='Connection refused') as raised:
            await SqlStepStore(engine).list_runs()
        assert classify_error(raised.value) == 'unreachable'
    finally:
        await engine.dispose()


async def test_a_cancelled_write_leaves_nothing_and_the_engine_serves_the_next(databases: PsycopgDatabases) -> None:
    engine = databases.engine(await databases.fresh())
    blocker = databases.engine(databases.names[0])
    async with SqlStepStore(engine) as store, blocker.connect() as holding:
        await store.register_run(RunRecord(run_id='locked'))
        await holding.execute(text("SELECT id FROM runs WHERE run_id = 'locked' FOR UPDATE"))  # the save waits
        save = asyncio.create_task(
            store.save_snapshot(ContinuableSnapshot(run_id='locked', step_index=1, messages=sample_history(1)))
        )
        await wait_until_a_connection_waits_for_a_lock(blocker)
        save.cancel()
        with pytest.raises(asyncio.CancelledError):
            await save
        await holding.rollback()
        assert await store.list_snapshots(run_id='locked') == []
        await store.save_snapshot(ContinuableSnapshot(run_id='locked', step_index=2, messages=sample_history(1)))
        assert [s.step_index for s in await store.list_snapshots(run_id='locked')] == [2]
    assert await row_counts(engine) == [1, 0, 1, 3, 0, 0]


async def test_a_url_names_the_driver_the_store_builds_and_how_to_share_psycopg() -> None:
    hint = 'asyncpg.*pass your own AsyncEngine, AsyncConnection or AsyncSession'
    with pytest.raises(ValueError, match=hint) as raised:
        SqlStepStore('postgresql+psycopg://app:hunter2@db.example/runs')
    assert 'hunter2' not in str(raised.value)


async def test_a_psycopg_engine_keeps_the_store_in_its_schema(databases: PsycopgDatabases) -> None:
    name = await databases.server.create_database()  # not migrated: the store creates the schema and its tables
    databases.names.append(name)
    engine = databases.engine(name)
    async with PostgresStepStore(engine, schema='steps') as store:
        await write_a_run(store, 'scoped')
        assert len(await store.list_snapshots(run_id='scoped')) == 1
    async with engine.connect() as connection:
        tables = await connection.run_sync(lambda sync: inspect(sync).get_table_names(schema='steps'))
        public = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
    assert {'runs', 'events', 'snapshots', 'messages', 'media'} <= set(tables)
    assert public == [], 'nothing of the store outside its schema'


_WITHOUT_ASYNCPG = """
import asyncio, sys
sys.modules['asyncpg'] = None  # importing asyncpg now raises ImportError
from sqlalchemy.ext.asyncio import create_async_engine
from step_persistence import RunRecord, SqlStepStore

async def main():
    engine = create_async_engine(sys.argv[1])
    async with SqlStepStore(engine) as store:
        await store.register_run(RunRecord(run_id='no-asyncpg'))
        print([run.run_id for run in await store.list_runs()])
    await engine.dispose()

asyncio.run(main())
"""


def test_a_psycopg_engine_needs_no_asyncpg(postgres_server: PostgresServer) -> None:
    name = asyncio.run(postgres_server.create_database(template=asyncio.run(postgres_template(postgres_server))))
    try:
        completed = subprocess.run(
            [sys.executable, '-c', _WITHOUT_ASYNCPG, psycopg_url(postgres_server, name)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout.strip() == "['no-asyncpg']"
    finally:
        asyncio.run(postgres_server.drop_database(name))
