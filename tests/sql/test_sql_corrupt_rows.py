"""Rows damaged behind the store's back are skipped with a log line; the rest stays readable."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore, StepEvent, ToolEffectRecord
from step_persistence._history import encode_messages
from step_persistence.stores.sql.schema import events, messages, runs, snapshots, tool_effects
from step_persistence.testing.conformance import sample_history
from step_persistence.testing.conformance.conversations import chat_history
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio


async def damage(url: str, *statements: object) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            for statement in statements:
                await connection.execute(statement)  # type: ignore[call-overload]
    finally:
        await engine.dispose()


async def test_damaged_rows_are_skipped_and_logged(
    empty_database: EmptyDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='r'))
        for step in range(1, 6):
            state = 'interrupted' if step == 5 else 'complete'
            await store.save_snapshot(
                ContinuableSnapshot(run_id='r', step_index=step, messages=sample_history(step), state=state)
            )
        for kind in ('run_started', 'run_completed'):
            await store.append_event(StepEvent(run_id='r', kind=kind, step_index=0))
        for call_id in ('good', 'bad'):
            await store.record_tool_effect(
                ToolEffectRecord(run_id='r', tool_call_id=call_id, tool_name='x', status='started')
            )

        await damage(
            empty_database.url,
            update(snapshots).where(snapshots.c.seq == 5).values(state='exploded'),
            update(snapshots).where(snapshots.c.seq == 4).values(history_length=999),
            update(snapshots).where(snapshots.c.seq == 3).values(through_message=-1),
            update(messages).where(messages.c.no == 2).values(body=b'{"kind": "no such message"}'),
            update(events).where(events.c.kind == 'run_completed').values(kind='exploded'),
            update(tool_effects).where(tool_effects.c.tool_call_id == 'bad').values(status='maybe'),
        )
        with caplog.at_level(logging.WARNING, logger='step_persistence'):
            assert await store.list_snapshots(run_id='r', include_interrupted=True) == []
            assert await store.latest_snapshot(run_id='r', include_interrupted=True) is None
            await damage(empty_database.url, update(messages).where(messages.c.no == 2).values(body=sample_body(2)))
            latest = await store.latest_snapshot(run_id='r', include_interrupted=True)
            assert latest is not None and latest.seq == 2, 'falls back past the damaged newer snapshots'
            assert [s.seq for s in await store.list_snapshots(run_id='r', include_interrupted=True)] == [1, 2]
            assert [e.kind for e in await store.list_events(run_id='r')] == ['run_started']
            assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id='r')] == ['good']
            assert await store.get_tool_effect(run_id='r', tool_call_id='bad') is None
        skipped = [record.getMessage() for record in caplog.records]
        assert any('snapshot 5' in line for line in skipped)
        assert any('snapshot 4' in line for line in skipped)
        assert any('snapshot 3' in line for line in skipped)
        assert any('event' in line for line in skipped)
        assert any("tool effect 'bad'" in line for line in skipped)


def sample_body(number: int) -> bytes:
    return encode_messages(sample_history(1))[number - 1].data


@pytest.mark.parametrize('cached_head', [True, False], ids=['cached head', 'fresh store'])
async def test_a_save_refused_for_a_damaged_counter_writes_nothing(
    empty_database: EmptyDatabase, cached_head: bool
) -> None:
    """A snapshot counter below zero would number the snapshot below zero: the save is refused whole (on
    PostgreSQL the one-statement flush must not commit it and then report the damage)."""
    engine = create_async_engine(empty_database.url)
    try:
        async with SqlStepStore(engine) as store:
            await store.register_run(RunRecord(run_id='r'))
            await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=chat_history(1)))
            await damage(empty_database.url, update(runs).where(runs.c.run_id == 'r').values(last_snapshot_seq=-5))
            saver = store if cached_head else SqlStepStore(engine)
            with pytest.raises(ValueError, match='snapshot counter'):
                await saver.save_snapshot(ContinuableSnapshot(run_id='r', step_index=2, messages=chat_history(2)))
            async with engine.connect() as connection:
                seqs = (await connection.execute(select(snapshots.c.seq).where(snapshots.c.run_id == 'r'))).scalars()
                assert sorted(seqs) == [1]
    finally:
        await engine.dispose()
