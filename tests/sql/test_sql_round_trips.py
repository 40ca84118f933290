"""Round trips to PostgreSQL per agent tool step, counted at the driver (issue 22: at most 3).

A tool step flushes twice: before the tool body runs (its `started` ledger record and events:
the durable commit crash evidence needs) and before the next model request (its completion,
events and the step's snapshot). On PostgreSQL each flush of one run is one statement in
autocommit (`stores/sql/flush_statement.py`): one round trip, no `BEGIN` or `COMMIT`. Counted with
`support.round_trips` (every asyncpg protocol call that waits for the server), so prepares and
transaction control are counted as well as statements.
"""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic_ai import Agent
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import Pool

from step_persistence import RunRecord, SqlStepStore, StepEvent, StepPersistence
from step_persistence.records import StepWrites
from support.databases import EmptyDatabase, statements_sent
from support.round_trips import count_round_trips, counting_every_engine
from support.scripted import calls, scripted, text

pytestmark = pytest.mark.anyio


async def run_agent(store: SqlStepStore, steps: int) -> None:
    """A run of `steps` sequential tool calls, then a final answer."""
    agent = Agent(
        scripted(*(calls(('lookup', {'step': step})) for step in range(steps)), text('done')),
        capabilities=[StepPersistence(store=store)],
    )

    @agent.tool_plain
    def lookup(step: int) -> str:
        return f'result {step}'

    await agent.run('go')


def counted_since(counts: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({kind: number - before[kind] for kind, number in counts.items() if number != before[kind]})


async def test_a_tool_step_costs_two_round_trips_on_an_application_engine(postgres_database: EmptyDatabase) -> None:
    engine = create_async_engine(postgres_database.url)
    counts = count_round_trips(engine)
    try:
        async with SqlStepStore(engine) as store:
            await store.migrate()
            await run_agent(store, 2)  # the connection prepares the flush statements (and asyncpg learns types)
            per_run = []
            for steps in (5, 15):
                before = counts.copy()
                await run_agent(store, steps)
                per_run.append(counted_since(counts, before))
            runs = await store.list_runs()
            events = await store.list_events(run_id=runs[-1].run_id)
            snapshots = await store.list_snapshots(run_id=runs[-1].run_id)
    finally:
        await engine.dispose()
    short, long = per_run
    assert sum(long.values()) - sum(short.values()) == 2 * 10, (short, long)
    assert long - short == Counter({'execute': 2 * 10}), 'no prepare, BEGIN or COMMIT grows with the steps'
    assert short['BEGIN'] == short['COMMIT'] == 1, 'registering the run is a transaction'
    assert sum(short.values()) <= 2 * 5 + 6, 'and a few per run: its registration, its start, its end'
    assert [event.kind for event in events].count('tool_call_started') == 15
    assert len(snapshots) == 16


async def test_the_stores_own_engine_takes_the_same_round_trips(postgres_database: EmptyDatabase) -> None:
    """From a URL the store runs its statements on the driver directly (`prepared.py`): the same statements."""
    with counting_every_engine() as counts:
        async with SqlStepStore(postgres_database.url) as store:
            await store.migrate()
            await run_agent(store, 2)
            per_run = []
            for steps in (5, 15):
                before = counts.copy()
                await run_agent(store, steps)
                per_run.append(counted_since(counts, before))
    short, long = per_run
    assert long - short == Counter({'execute': 2 * 10})


async def test_the_stores_own_engine_gives_a_connection_back_out_of_autocommit(
    postgres_database: EmptyDatabase,
) -> None:
    """On the store's own engine a flush of one run runs in autocommit straight on a pooled connection
    (`executors.py`); the connection goes back to the pool as it came, so the next transaction on it (a batch
    of two runs) still begins and commits."""
    opened: list[object] = []

    def on_connect(dbapi_connection: object, record: object) -> None:
        opened.append(dbapi_connection)

    event.listen(Pool, 'connect', on_connect)
    with counting_every_engine() as counts:
        async with SqlStepStore(postgres_database.url) as store:
            await store.migrate()
            await store.register_run(RunRecord(run_id='r'))
            before = counts.copy()
            await store.write_batch(StepWrites(events=[StepEvent(run_id='r', kind='run_started', step_index=0)]))
            flushed = counted_since(counts, before)
            before = counts.copy()
            two_runs = [StepEvent(run_id=run_id, kind='run_started', step_index=0) for run_id in ('r', 'other')]
            await store.write_batch(StepWrites(events=two_runs))
            transaction = counted_since(counts, before)
            assert [event.kind for event in await store.list_events(run_id='r')] == ['run_started'] * 2
    event.remove(Pool, 'connect', on_connect)
    assert len(opened) == 1, 'one connection served every operation'
    assert flushed == Counter({'execute': 1}) or flushed == Counter({'prepare': 1, 'execute': 1}), flushed
    assert transaction['BEGIN'] == transaction['COMMIT'] == 1, transaction


async def test_in_a_callers_transaction_the_flush_statement_joins_it(postgres_database: EmptyDatabase) -> None:
    """On a caller's connection the flush is one statement of the caller's transaction (no autocommit): a
    rollback removes the run's writes."""
    engine = create_async_engine(postgres_database.url)
    flushes = statements_sent(engine, 'WITH')
    try:
        async with SqlStepStore(engine) as store:
            await store.migrate()
        async with engine.connect() as connection:
            assert isinstance(connection, AsyncConnection)
            transaction = await connection.begin()
            async with SqlStepStore(connection) as store:
                await run_agent(store, 3)
                assert len(await store.list_runs()) == 1
                assert connection.in_transaction()
            await transaction.rollback()
        async with SqlStepStore(engine) as store:
            assert await store.list_runs() == []
    finally:
        await engine.dispose()
    assert len(flushes) >= 2 * 3, 'the flushes went through the statement in one'
