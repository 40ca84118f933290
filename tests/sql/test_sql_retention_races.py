"""PostgreSQL: retention holds when saves of one run race (a flush in one statement sees the snapshots as they were
when it began, so saves that waited for each other's lock miss each other's snapshots)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore
from step_persistence.testing.conformance.conversations import chat_history
from support.databases import EmptyDatabase, wait_until_a_connection_waits_for_a_lock

pytestmark = pytest.mark.anyio


def snapshot(step: int) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id='r', step_index=step, messages=chat_history(step), state='interrupted')


async def test_saves_that_waited_for_each_other_still_keep_only_what_retention_keeps(
    postgres_database: EmptyDatabase,
) -> None:
    engine = create_async_engine(postgres_database.url)
    try:
        async with SqlStepStore(engine, max_snapshots_per_run=2) as store:
            await store.register_run(RunRecord(run_id='r'))
            for step in (1, 2, 3):
                await store.save_snapshot(snapshot(step))
            async with engine.connect() as holder:
                await holder.begin()
                await holder.execute(text("SELECT 1 FROM runs WHERE run_id = 'r' FOR UPDATE"))
                racing = [asyncio.create_task(store.save_snapshot(snapshot(step))) for step in (4, 5, 6)]
                # All three statements have begun (their snapshots hold seqs 2 and 3 only) and wait for the run.
                await wait_until_a_connection_waits_for_a_lock(engine, connections=3)
                await holder.rollback()
            await asyncio.gather(*racing)
            retained = await store.list_snapshots(run_id='r', include_interrupted=True)
        assert [saved.seq for saved in retained] == [5, 6], 'the two newest, whatever the order the saves ran in'
    finally:
        await engine.dispose()


async def test_a_save_waiting_for_the_run_holds_nothing_a_pruning_save_needs(postgres_database: EmptyDatabase) -> None:
    """A save holding the run's row may delete the snapshot another save of the run builds on (retention does):
    the waiting save must not have locked that snapshot first, or each would wait for the other (a deadlock)."""
    engine = create_async_engine(postgres_database.url)
    try:
        async with SqlStepStore(engine) as store:
            await store.register_run(RunRecord(run_id='r'))
            for step in (1, 2, 3):
                await store.save_snapshot(snapshot(step))
            async with engine.connect() as holder:
                await holder.begin()
                await holder.execute(text("UPDATE runs SET last_snapshot_seq = last_snapshot_seq WHERE run_id = 'r'"))
                racing = asyncio.create_task(store.save_snapshot(snapshot(4)))  # builds on seq 3, its cached head
                await wait_until_a_connection_waits_for_a_lock(engine)
                deleted = await holder.execute(text("DELETE FROM snapshots WHERE run_id = 'r' AND seq = 3"))
                assert deleted.rowcount == 1
                await holder.commit()
            await racing
            retained = await store.list_snapshots(run_id='r', include_interrupted=True)
        assert [(saved.seq, saved.step_index) for saved in retained] == [(1, 1), (2, 2), (4, 4)]
        assert retained[-1].messages == chat_history(4)
    finally:
        await engine.dispose()
