"""The PostgreSQL engine a store builds from a URL hands out live connections without pinging busy ones.

`engines.postgres_engine` replaces a pooled connection the server closed (the driver saw its socket
close) and pings one that sat idle past `PING_AFTER_IDLE_SECONDS`; a connection in steady use is
not pinged, which is what makes an operation cheaper than with `pool_pre_ping`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError

import step_persistence.stores.sql.engines as engines
from step_persistence import PostgresStepStore, RunRecord, StepEvent, classify_error
from support.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def database(postgres_server: PostgresServer) -> AsyncIterator[str]:
    name = await postgres_server.create_database()
    yield name
    await postgres_server.drop_database(name)


async def _terminate_store_connections(server: PostgresServer, database: str) -> int:
    """End every other session on `database`, waiting until each backend has exited; how many there were."""
    connection = await asyncpg.connect(host='127.0.0.1', port=server.port, user='postgres', database='postgres')
    try:
        ended = await connection.fetch(
            'SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = $1', database
        )
    finally:
        await connection.close()
    assert all(row[0] for row in ended)
    return len(ended)


def _terminate_while_the_loop_is_blocked(server: PostgresServer, database: str) -> int:
    """The same, from another thread, while this event loop waits: its sockets see the close only later."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, _terminate_store_connections(server, database)).result()


def _event(step: int) -> StepEvent:
    return StepEvent(run_id='r', kind='run_started', step_index=step)


async def test_a_connection_the_server_closed_is_replaced_before_the_next_write(
    postgres_server: PostgresServer, database: str
) -> None:
    async with PostgresStepStore(postgres_server.url(database)) as store:
        await store.register_run(RunRecord(run_id='r'))
        assert await _terminate_store_connections(postgres_server, database) == 1
        await store.append_event(_event(0))
        assert [event.step_index for event in await store.list_events(run_id='r')] == [0]


async def test_an_idle_connection_is_pinged_and_replaced_when_dead(
    postgres_server: PostgresServer, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, 'PING_AFTER_IDLE_SECONDS', 0.0)
    async with PostgresStepStore(postgres_server.url(database)) as store:
        await store.register_run(RunRecord(run_id='r'))
        assert _terminate_while_the_loop_is_blocked(postgres_server, database) == 1
        await store.append_event(_event(0))
        assert [event.step_index for event in await store.list_events(run_id='r')] == [0]


async def test_a_busy_connection_is_not_pinged_so_an_unnoticed_drop_fails_one_write(
    postgres_server: PostgresServer, database: str
) -> None:
    """The price of no round trip per checkout: a drop the driver has not seen yet fails the write using it."""
    async with PostgresStepStore(postgres_server.url(database)) as store:
        await store.register_run(RunRecord(run_id='r'))
        assert _terminate_while_the_loop_is_blocked(postgres_server, database) == 1
        with pytest.raises(DBAPIError) as raised:
            await store.append_event(_event(0))
        assert classify_error(raised.value) == 'unreachable'
        await store.append_event(_event(1))
        assert [event.step_index for event in await store.list_events(run_id='r')] == [1]
