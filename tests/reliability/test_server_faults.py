"""The database server stops in the middle of an agent run, then comes back on the same port and data.

Each test has a server of its own (`private_servers`), never the session-wide one. The run's tool
stops the server while the run is between two writes, so the next write is the one that fails:
it must raise an error that says the store is unreachable within the configured timeout, the
store must work again once the server is back, and nothing committed before the outage is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from pydantic_ai import Agent
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from step_persistence import (
    MongoStepStore,
    PostgresStepStore,
    StepPersistence,
    StepStore,
    classify_error,
    continue_run,
    inspect_recovery,
    is_provider_valid,
)
from support.private_servers import PrivateMongo, PrivatePostgres
from support.scripted import calls, scripted, text
from support.servers import skip_if_opted_out

pytestmark = pytest.mark.anyio

TIMEOUT_SECONDS = 2.0
"""The client timeouts the tests configure (connect, statement, socket, server selection)."""
GRACE_SECONDS = 15.0
"""Slack on a loaded machine: once the server is down, the run (two failing flushes: the tool's, then
the failure's) must fail within timeout x 2 + this; when the server is frozen, within timeout x 8 +
this (each failing write may wait out several timeouts: a ping and a connection attempt on
PostgreSQL; a socket timeout, a retry and server selection on MongoDB). Without configured
timeouts a frozen server makes a write wait forever (pymongo's default socket timeout is none), and
a stopped MongoDB server 30 s per write (the default server selection timeout)."""


@pytest.fixture(scope='module')
def private_postgres() -> Iterator[PrivatePostgres]:
    skip_if_opted_out('postgres')
    server = PrivatePostgres()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope='module')
def private_mongo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMongo]:
    skip_if_opted_out('mongo')
    server = PrivateMongo(tmp_path_factory.mktemp('faults-mongo'))
    try:
        yield server
    finally:
        server.close()


def outage_agent(store: StepStore, stop_server: Callable[[], None], run_id: str) -> Agent[None, str]:
    """Books a seat (a whole tool cycle, committed), then a tool whose body stops the database."""
    agent = Agent(
        scripted(calls(('book', {'seat': '7A'}, 'book-1')), calls(('notify', {}, 'notify-1')), text('booked')),
        capabilities=[StepPersistence(store=store, run_id=run_id)],
    )

    @agent.tool_plain
    async def book(seat: str) -> str:
        return f'booked {seat}'

    @agent.tool_plain
    async def notify() -> str:
        await anyio.to_thread.run_sync(stop_server)
        return 'notified'

    return agent


async def run_through_outage(
    store: StepStore,
    open_fresh: Callable[[], StepStore],
    stop: Callable[[], None],
    start: Callable[[], None],
    *,
    frozen: bool = False,
) -> None:
    """Run the outage agent, bring the server back, and check what the store kept.

    `frozen`: the server was suspended, not stopped, so writes that timed out on the client may
    still land once it resumes; then only what was committed before the outage is pinned down.
    """
    stopped_at: list[float] = []

    def stop_and_note() -> None:
        stop()
        stopped_at.append(time.monotonic())

    failure: Exception | None = None
    with anyio.fail_after(60 + 2 * TIMEOUT_SECONDS + GRACE_SECONDS):
        try:
            await outage_agent(store, stop_and_note, 'outage').run('book me a seat')
        except Exception as error:  # whatever the driver raises, it must say the store is unreachable
            failure = error
    assert failure is not None, 'the write after the outage must fail'
    assert classify_error(failure) == 'unreachable', repr(failure)
    elapsed = time.monotonic() - stopped_at[0]
    bound = (8 if frozen else 2) * TIMEOUT_SECONDS + GRACE_SECONDS
    print(f'failed {elapsed:.1f} s after the outage began: {failure!r}'[:300])
    assert elapsed < bound, f'the run took {elapsed:.1f} s to fail: {failure!r}'

    await anyio.to_thread.run_sync(start)

    # The same store object works again: a new run, continuing from the last complete snapshot.
    history = await continue_run(store, run_id='outage')
    assert is_provider_valid(history)
    resumed = Agent(scripted(text('resumed')), capabilities=[StepPersistence(store=store, run_id='after')])
    assert (await resumed.run('go on', message_history=history)).output == 'resumed'

    async with open_fresh() as fresh:
        assert [run.run_id for run in await fresh.list_runs()] == ['outage', 'after']
        report = await inspect_recovery(store=fresh, run_id='outage')
        effect = await fresh.get_tool_effect(run_id='outage', tool_call_id='notify-1')
        assert effect is not None
        if not frozen or effect.status == 'started':
            assert [effect.tool_call_id for effect in report.unresolved_effects] == ['notify-1']
        assert report.completed_tools[:1] == ['book']
        assert report.latest_complete_snapshot is not None
        if not frozen:
            assert report.latest_complete_snapshot.messages == history
        events = await fresh.list_events(run_id='outage')
        keys = [event.idempotency_key for event in events]
        assert len(keys) == len(set(keys)), 'no event was written twice'
        kinds = [event.kind for event in events]
        assert kinds[: 8 if frozen else None] == [
            'run_started',
            'model_request_started',
            'model_request_completed',
            'tool_call_started',
            'tool_call_completed',
            'model_request_started',
            'model_request_completed',
            'tool_call_started',
        ], 'everything written before the outage is there, nothing after it'
        after = [event.kind for event in await fresh.list_events(run_id='after')]
        assert after[0] == 'run_started' and after[-1] == 'run_completed'


async def test_postgres_stopped_mid_run_fails_the_write_clearly_and_loses_nothing_committed(
    private_postgres: PrivatePostgres,
) -> None:
    server = private_postgres.server
    database = await server.create_database()
    url = server.url(database)
    store = PostgresStepStore(url)
    try:
        await run_through_outage(store, lambda: PostgresStepStore(url), private_postgres.stop, private_postgres.start)
    finally:
        await store.aclose()


async def test_mongo_stopped_mid_run_fails_the_write_within_the_timeout_and_loses_nothing(
    private_mongo: PrivateMongo, tmp_path: Path
) -> None:
    timeout_ms = int(TIMEOUT_SECONDS * 1000)
    url = private_mongo.uri + f'&serverSelectionTimeoutMS={timeout_ms}&connectTimeoutMS={timeout_ms}'
    options: dict[str, Any] = {'db_url': url, 'database': f'faults_{tmp_path.name}'[:60]}
    store = MongoStepStore(**options)
    try:
        await run_through_outage(store, lambda: MongoStepStore(**options), private_mongo.stop, private_mongo.start)
    finally:
        await store.aclose()


@pytest.mark.parametrize('configured_on', ['url', 'engine'])
async def test_postgres_frozen_mid_run_fails_the_write_within_the_configured_timeouts(
    private_postgres: PrivatePostgres, configured_on: str
) -> None:
    """A server that accepts connections but never answers (SIGSTOP): the timeouts end the wait, whether
    the URL the store builds its engine from sets them or the caller's own engine does."""
    server = private_postgres.server
    url = server.url(await server.create_database())
    engines: list[AsyncEngine] = []

    def open_store() -> PostgresStepStore:
        if configured_on == 'url':
            return PostgresStepStore(f'{url}?timeout={TIMEOUT_SECONDS}&command_timeout={TIMEOUT_SECONDS}')
        timeouts = {'timeout': TIMEOUT_SECONDS, 'command_timeout': TIMEOUT_SECONDS}
        engines.append(create_async_engine(url, pool_pre_ping=True, connect_args=timeouts))
        return PostgresStepStore(engines[-1])

    store = open_store()
    try:
        await run_through_outage(store, open_store, private_postgres.freeze, private_postgres.thaw, frozen=True)
    finally:
        await store.aclose()
        for made in engines:
            await made.dispose()


async def test_mongo_frozen_mid_run_fails_the_write_within_the_configured_timeouts(
    private_mongo: PrivateMongo, tmp_path: Path
) -> None:
    timeout_ms = int(TIMEOUT_SECONDS * 1000)
    timeouts = f'&serverSelectionTimeoutMS={timeout_ms}&connectTimeoutMS={timeout_ms}&socketTimeoutMS={timeout_ms}'
    options: dict[str, Any] = {'db_url': private_mongo.uri + timeouts, 'database': f'frozen_{tmp_path.name}'[:60]}
    store = MongoStepStore(**options)
    try:
        await run_through_outage(
            store, lambda: MongoStepStore(**options), private_mongo.freeze, private_mongo.thaw, frozen=True
        )
    finally:
        await store.aclose()
