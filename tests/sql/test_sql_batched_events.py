"""A batch's events reach the database several per statement, in order, on SQLite and PostgreSQL.

SQLite appends them with one many-row `executemany` (its driver counts the rows inserted);
PostgreSQL with one multi-row `INSERT ... SELECT ... FROM (VALUES ...)` per run and per
`EVENTS_PER_STATEMENT` events (asyncpg's `executemany` counts nothing). Either way a count short of
the events is a repeated idempotency key (skipped) or a run not stored, which is then registered
bare and gets its events.
"""

from __future__ import annotations

import math

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import RunRecord, SqlStepStore, StepEvent
from step_persistence.records import StepWrites
from step_persistence.stores.sql.statements import EVENTS_PER_STATEMENT
from support.databases import EmptyDatabase, statements_sent

pytestmark = pytest.mark.anyio


def _event(run_id: str, step: int, key: str | None = None) -> StepEvent:
    return StepEvent(run_id=run_id, kind='tool_call_started', step_index=step, idempotency_key=key)


async def test_events_of_a_batch_are_appended_several_per_statement_in_order(empty_database: EmptyDatabase) -> None:
    engine = create_async_engine(empty_database.url)
    inserts = statements_sent(engine, 'INSERT INTO events')
    many = EVENTS_PER_STATEMENT + 4
    batch = [_event('a', step) for step in range(many)] + [_event('b', 0), _event('a', many)]
    try:
        async with SqlStepStore(engine) as store:
            for run_id in ('a', 'b'):
                await store.register_run(RunRecord(run_id=run_id))
            inserts.clear()
            await store.write_batch(StepWrites(events=batch))
            stored_a = [found.step_index for found in await store.list_events(run_id='a')]
            stored_b = [found.step_index for found in await store.list_events(run_id='b')]
    finally:
        await engine.dispose()
    assert stored_a == list(range(many + 1))
    assert stored_b == [0]
    if empty_database.dialect == 'sqlite':
        assert len(inserts) == 1
    else:
        assert len(inserts) == math.ceil(many / EVENTS_PER_STATEMENT) + 2


async def test_a_multi_row_append_skips_repeated_keys_and_registers_an_unknown_run_bare(
    empty_database: EmptyDatabase,
) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='a'))
        await store.write_batch(StepWrites(events=[_event('a', 0, 'k0'), _event('a', 1, 'k0'), _event('a', 2)]))
        await store.write_batch(StepWrites(events=[_event('a', 3, 'k0'), _event('a', 4)]))
        assert [found.step_index for found in await store.list_events(run_id='a')] == [0, 2, 4]
        mixed = [
            _event('a', 5, 'k0'),
            _event('ghost', 0),
            _event('a', 6),
            _event('ghost', 1, 'g'),
            _event('ghost', 2, 'g'),
        ]
        await store.write_batch(StepWrites(events=mixed))
        assert [found.step_index for found in await store.list_events(run_id='a')] == [0, 2, 4, 6]
        assert [found.step_index for found in await store.list_events(run_id='ghost')] == [0, 1]
        assert await store.get_run(run_id='ghost') == RunRecord(run_id='ghost', started_at=mixed[1].timestamp)
        await store.write_batch(StepWrites(events=[_event('a', 7, 'k0'), _event('new', 0, 'k0'), _event('new', 1)]))
        assert [found.step_index for found in await store.list_events(run_id='a')] == [0, 2, 4, 6]
        assert [found.step_index for found in await store.list_events(run_id='new')] == [0, 1]
