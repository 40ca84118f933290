"""An application on raw asyncpg (issue 19, item 10): the stores on its own `asyncpg.Pool` or `asyncpg.Connection`.

On the session's real PostgreSQL server. A pool lends the store a connection per operation and
gets it back; a connection is shared. Neither is closed by the store's `aclose()`, and both
decode the application's JSON as before (the store installs no type codec on them). On a
connection inside the application's transaction, the store's writes are savepoints of it: the
application's rollback removes them, its commit keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from step_persistence import ContinuableSnapshot, PostgresStepStore, RunRecord, SqlStepStore, StepEvent, StepPersistence
from step_persistence.media import MediaContext, PostgresMediaStore, SqlMediaStore
from support.scripted import calls, scripted, text
from support.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio

TARGETS = ['pool', 'connection', 'pooled_connection']

SQL_PAGE = Path(__file__).resolve().parents[2] / 'docs' / 'sql.md'

JSON_DOCUMENT = '{"b": 1, "a": [true, null]}'
"""A JSON value of the application's; asyncpg's default codecs return it as this text."""


@dataclass
class Raw:
    """A database on the session's server, as an application on raw asyncpg reaches it."""

    server: PostgresServer
    name: str

    @property
    def url(self) -> str:
        return self.server.url(self.name)

    async def connect(self) -> Any:
        return await asyncpg.connect(host='127.0.0.1', port=self.server.port, user='postgres', database=self.name)

    async def pool(self, **options: Any) -> Any:
        return await asyncpg.create_pool(
            host='127.0.0.1', port=self.server.port, user='postgres', database=self.name, **options
        )


@pytest.fixture
async def raw(postgres_server: PostgresServer) -> AsyncIterator[Raw]:
    name = await postgres_server.create_database()
    yield Raw(postgres_server, name)
    await postgres_server.drop_database(name)


@pytest.fixture
async def pool(raw: Raw) -> AsyncIterator[Any]:
    pool = await raw.pool(min_size=1, max_size=2)
    yield pool
    await pool.close()


@pytest.fixture
async def connection(raw: Raw) -> AsyncIterator[Any]:
    connection = await raw.connect()
    yield connection
    await connection.close()


@pytest.fixture
async def pooled_connection(pool: Any) -> AsyncIterator[Any]:
    """A connection the application acquired from its pool (and gives it back afterwards)."""
    async with pool.acquire() as connection:
        yield connection


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> Any:
    """The application's pool, its connection, or a connection it acquired from its pool."""
    return request.getfixturevalue(request.param)


async def decodes_json_as_text(target: Any) -> bool:
    """Whether the application's own query reads its JSON and JSONB as asyncpg's default, the text."""
    row = await target.fetchrow('SELECT $1::text::json AS j, $1::text::jsonb AS jb', JSON_DOCUMENT)
    as_text = row['j'] == JSON_DOCUMENT and isinstance(row['jb'], str)
    return as_text and json.loads(row['jb']) == json.loads(JSON_DOCUMENT)


def lookup_agent(store: PostgresStepStore) -> Agent[None, str]:
    """An agent whose model calls the `lookup` tool once, then answers."""
    agent = Agent(
        scripted(calls(('lookup', {'key': 'k1'})), text('done')),
        capabilities=[StepPersistence(store=store, agent_name='raw', run_id='raw-run', metadata={'via': 'asyncpg'})],
    )

    @agent.tool_plain
    def lookup(key: str) -> str:
        return f'value of {key}'

    return agent


async def assert_whole_run_stored(store: PostgresStepStore, history: list[ModelMessage]) -> None:
    run = await store.get_run(run_id='raw-run')
    assert run is not None
    assert (run.agent_name, run.metadata) == ('raw', {'via': 'asyncpg'})
    kinds = [event.kind for event in await store.list_events(run_id='raw-run')]
    assert kinds[0] == 'run_started' and kinds[-1] == 'run_completed'
    assert {'tool_call_started', 'tool_call_completed', 'model_request_completed'} <= set(kinds)
    effect = await store.get_tool_effect(run_id='raw-run', tool_call_id='lookup-0')
    assert effect is not None and effect.status == 'completed'
    latest = await store.latest_snapshot(run_id='raw-run')
    assert latest is not None and latest.messages == history
    returns = [part for message in history for part in message.parts if isinstance(part, ToolReturnPart)]
    assert [part.content for part in returns] == ['value of k1']


async def test_an_agent_run_is_stored_whole_and_the_callers_pool_or_connection_stays_open(
    raw: Raw, target: Any
) -> None:
    store = PostgresStepStore(target)
    result = await lookup_agent(store).run('look k1 up')
    assert result.output == 'done'
    history = result.all_messages()
    await assert_whole_run_stored(store, history)
    await store.aclose()

    assert await target.fetchval('SELECT 41 + 1') == 42, 'still open, and the application can use it'
    if isinstance(target, asyncpg.Pool):
        assert not target.is_closing()
    else:
        assert not target.is_closed() and not target.is_in_transaction()
    async with PostgresStepStore(raw.url) as observer:  # committed, and stored as any store stores it
        await assert_whole_run_stored(observer, history)
    metadata_types = await target.fetch('SELECT DISTINCT jsonb_typeof(metadata) FROM runs')
    assert [row[0] for row in metadata_types] == ['object'], 'JSON stored as JSON, not as a JSON string'


async def test_the_pool_lends_connections_only_during_operations(pool: Any) -> None:
    async with PostgresStepStore(pool) as store:
        await store.register_run(RunRecord(run_id='r'))
        assert pool.get_idle_size() == pool.get_size(), 'every connection is back in the pool'
        for step in range(6):  # more operations than the pool has connections
            await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=step))
        assert pool.get_idle_size() == pool.get_size()
        async with pool.acquire() as held:  # the application holds one of two: the store uses the other
            await store.append_event(StepEvent(run_id='r', kind='run_completed', step_index=6))
            assert await held.fetchval('SELECT count(*) FROM events') == 7
    assert pool.get_idle_size() == pool.get_size()


async def test_the_callers_json_decoding_is_unchanged(raw: Raw, target: Any) -> None:
    assert await decodes_json_as_text(target)
    async with PostgresStepStore(target) as store:
        await store.register_run(RunRecord(run_id='r', metadata={'k': 'v'}))
        run = await store.get_run(run_id='r')
        assert run is not None and run.metadata == {'k': 'v'}, 'the store decodes its own JSON columns'
        assert await decodes_json_as_text(target)
    assert await decodes_json_as_text(target)
    if isinstance(target, asyncpg.Pool):
        async with target.acquire() as first, target.acquire() as second:  # each of the pool's connections
            assert await decodes_json_as_text(first) and await decodes_json_as_text(second)


@pytest.mark.parametrize('given', ['pool', 'connection'])
async def test_json_codecs_of_the_callers_own_are_refused_before_anything_is_written(raw: Raw, given: str) -> None:
    async def decode_jsonb(connection: Any) -> None:
        await connection.set_type_codec('jsonb', encoder=json.dumps, decoder=json.loads, schema='pg_catalog')

    pool = await raw.pool(min_size=1, max_size=1, init=decode_jsonb)
    try:
        async with contextlib.AsyncExitStack() as stack:
            store = PostgresStepStore(pool if given == 'pool' else await stack.enter_async_context(pool.acquire()))
            with pytest.raises(TypeError, match='codec of its own'):
                await store.register_run(RunRecord(run_id='r'))
            await store.aclose()
        assert pool.get_idle_size() == pool.get_size() == 1, 'the connection went back to the pool'
        assert await pool.fetchval("SELECT to_regclass('runs')") is None, 'nothing was written, not even the tables'
    finally:
        await pool.close()


async def test_on_a_connection_in_the_callers_transaction_rollback_removes_and_commit_keeps(
    raw: Raw, connection: Any
) -> None:
    await connection.execute('CREATE TABLE app_orders (run_id text PRIMARY KEY)')
    store = PostgresStepStore(connection)
    await store.migrate()
    observer = PostgresStepStore(raw.url)

    transaction = connection.transaction()
    await transaction.start()
    await store.register_run(RunRecord(run_id='rolled-back'))
    await connection.execute("INSERT INTO app_orders VALUES ('rolled-back')")
    assert await observer.get_run(run_id='rolled-back') is None, 'not committed yet'
    await transaction.rollback()
    assert await store.get_run(run_id='rolled-back') is None
    assert await observer.get_run(run_id='rolled-back') is None

    async with connection.transaction():
        await store.register_run(RunRecord(run_id='kept'))
        await store.append_event(StepEvent(run_id='kept', kind='run_started', step_index=0))
        await connection.execute("INSERT INTO app_orders VALUES ('kept')")
        with pytest.raises(ValueError, match='already'):  # a failed operation leaves the transaction usable
            await store.register_run(RunRecord(run_id='kept'))
        assert await observer.get_run(run_id='kept') is None, 'the store did not commit the transaction'
        assert connection.is_in_transaction()
    assert await observer.get_run(run_id='kept') is not None
    assert [event.step_index for event in await observer.list_events(run_id='kept')] == [0]
    assert await connection.fetchval('SELECT array_agg(run_id) FROM app_orders') == ['kept']

    await connection.execute('BEGIN')  # a transaction begun by hand, not by asyncpg
    await store.register_run(RunRecord(run_id='by-hand'))
    await connection.execute('ROLLBACK')
    assert await observer.get_run(run_id='by-hand') is None

    await store.register_run(RunRecord(run_id='outside'))  # outside a transaction: the store commits
    assert not connection.is_in_transaction()
    assert await observer.get_run(run_id='outside') is not None
    await store.aclose()
    await observer.aclose()


async def test_auto_migration_with_a_schema_and_a_table_prefix(raw: Raw, target: Any) -> None:
    async with PostgresStepStore(target, schema='steps', table_prefix='sp_') as store:
        await store.register_run(RunRecord(run_id='r'))  # the first write creates the schema and its tables
    tables = await target.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'steps' ORDER BY 1")
    names = [row[0] for row in tables]
    assert 'sp_runs' in names and 'sp_step_persistence_alembic_version' in names, names
    assert await target.fetchval("SELECT to_regclass('public.runs')") is None
    async with PostgresStepStore(raw.url, schema='steps', table_prefix='sp_') as observer:
        assert await observer.get_run(run_id='r') is not None


async def test_the_media_store_on_a_callers_pool_or_connection(raw: Raw, target: Any) -> None:
    context = MediaContext(media_type='image/png', metadata={'k': 'v'})
    media = PostgresMediaStore(target)
    uri = await media.put(b'\x89PNG blob', context=context)
    assert await media.get(uri, context=context) == b'\x89PNG blob'
    assert dict(await media.get_metadata(uri, context=context))['k'] == 'v'
    await media.aclose()
    assert await target.fetchval('SELECT count(*) FROM media') == 1, 'still open'
    assert await decodes_json_as_text(target)

    if not isinstance(target, asyncpg.Pool):
        media = PostgresMediaStore(target)
        async with target.transaction():
            kept = await media.put(b'kept', context=context)
        transaction = target.transaction()
        await transaction.start()
        dropped = await media.put(b'dropped', context=context)
        await transaction.rollback()
        assert await media.exists(kept, context=context)
        assert not await media.exists(dropped, context=context)
        await media.aclose()


async def test_a_step_stores_payloads_go_to_the_media_table_through_the_callers_pool_or_connection(
    raw: Raw, target: Any
) -> None:
    payload = BinaryContent(b'\x00' * 4096, media_type='application/octet-stream')
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['see', payload])]),
        ModelResponse(parts=[ToolCallPart('t', {}, 'c')]),
    ]
    async with PostgresStepStore(target, media_threshold_bytes=1024) as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=0, messages=history))
        latest = await store.latest_snapshot(run_id='r', include_interrupted=True)
        assert latest is not None and latest.messages == history
    assert await target.fetchval('SELECT count(*) FROM media') == 1


async def test_the_docs_example_runs_as_written(raw: Raw) -> None:
    """docs/sql.md's example (a `py` block: the docs' own run has no server), on the session's server."""
    page = SQL_PAGE.read_text()
    section = page[page.index('### An application on raw asyncpg') :]
    code = section[section.index('```py\n') + len('```py\n') : section.index('\n```\n')]
    dsn = f'postgresql://postgres@127.0.0.1:{raw.server.port}/{raw.name}'
    assert "DSN = 'postgresql://app@db.internal/app'" in code
    code = code.replace("DSN = 'postgresql://app@db.internal/app'", f'DSN = {dsn!r}')
    with anyio.fail_after(60):
        completed = await anyio.run_process([sys.executable, '-c', code], check=False)
    assert completed.returncode == 0, completed.stderr.decode()
    assert completed.stdout.decode().splitlines() == ["['nightly', 'order-42']", "'[1, 2]'"]


async def wait_until_blocked_on_a_lock(observer: Any) -> None:
    """Return once some other session of the database waits for a lock (each look a statement of its own)."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    for _ in range(10_000):
        if await observer.fetchval(query):
            return
    raise AssertionError('no session waited for a lock')


@pytest.mark.parametrize('in_callers_transaction', [False, True], ids=['outside', 'inside'])
async def test_a_cancelled_operation_on_the_callers_connection_ends_whole_before_the_cancellation(
    raw: Raw, connection: Any, in_callers_transaction: bool
) -> None:
    """Interrupted midway, it would leave the connection in the store's transaction, or the caller's aborted."""
    store = PostgresStepStore(connection)
    await store.register_run(RunRecord(run_id='r'))
    await connection.execute('CREATE TABLE app_orders (id int)')
    locker = await raw.connect()
    try:
        if in_callers_transaction:
            transaction = connection.transaction()
            await transaction.start()
            await connection.execute('INSERT INTO app_orders VALUES (1)')
        await locker.execute('BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE')
        write = asyncio.ensure_future(store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0)))
        await wait_until_blocked_on_a_lock(locker)
        write.cancel()  # while its INSERT waits for the lock
        await locker.execute('ROLLBACK')
        with pytest.raises(asyncio.CancelledError):  # once the operation has ended
            await write
        assert connection.is_in_transaction() is in_callers_transaction, 'no transaction of the store left open'
        assert await connection.fetchval('SELECT count(*) FROM app_orders') == int(in_callers_transaction)
        if in_callers_transaction:
            await transaction.commit()
        assert await locker.fetchval('SELECT array_agg(step_index) FROM events') == [0], 'written whole, committed'
        await store.append_event(StepEvent(run_id='r', kind='run_completed', step_index=1))
        assert [event.step_index for event in await store.list_events(run_id='r')] == [0, 1]
    finally:
        await locker.close()
        await store.aclose()


async def test_the_generic_sql_stores_take_them_too_and_say_what_they_were_given(raw: Raw, target: Any) -> None:
    given = 'an asyncpg pool' if isinstance(target, asyncpg.Pool) else 'an asyncpg connection'
    async with SqlStepStore(target) as store, SqlMediaStore(target) as media:
        assert repr(store) == f'SqlStepStore({given})'
        assert repr(PostgresStepStore(target)) == f'PostgresStepStore({given})'
        await store.register_run(RunRecord(run_id='r'))
        uri = await media.put(b'blob', context=MediaContext())
        assert await media.get(uri, context=MediaContext()) == b'blob'
    async with PostgresStepStore(raw.url) as observer:
        assert await observer.get_run(run_id='r') is not None
