"""Runs registered by their first write, on SQL, where writers race: two stores on their own engines (on
SQLite two writers of one file, on PostgreSQL concurrent transactions) writing first to the same new runs
register each run once and lose no write; on PostgreSQL a first write waits for another connection's
uncommitted one, then lands in the run it registered (or registers the run itself if that one rolls back)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore, StepEvent, ToolEffectRecord
from step_persistence.testing.conformance import T0, sample_history
from support.databases import EmptyDatabase, wait_until_a_connection_waits_for_a_lock

pytestmark = pytest.mark.anyio

RUN_IDS = ('r0', 'r1', 'r2')


async def test_two_stores_writing_first_to_the_same_new_runs_register_each_once(
    empty_database: EmptyDatabase,
) -> None:
    async with SqlStepStore(empty_database.url) as left, SqlStepStore(empty_database.url) as right:
        await left.migrate()
        writes = [
            write
            for run_id in RUN_IDS
            for step in range(3)
            for side, store in (('left', left), ('right', right))
            for write in (
                store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=step, timestamp=T0)),
                store.record_tool_effect(
                    ToolEffectRecord(
                        run_id=run_id, tool_call_id=f'{side}-{step}', tool_name='t', status='started', started_at=T0
                    )
                ),
                store.save_snapshot(
                    ContinuableSnapshot(
                        run_id=run_id, step_index=step, messages=sample_history(step, tag=side), timestamp=T0
                    )
                ),
            )
        ]
        await asyncio.gather(*writes)
        assert await left.list_runs() == [RunRecord(run_id=run_id, started_at=T0) for run_id in RUN_IDS]
        for run_id in RUN_IDS:
            assert len(await right.list_events(run_id=run_id)) == 6
            assert len(await right.list_tool_effects(run_id=run_id)) == 6
            assert len(await right.list_snapshots(run_id=run_id)) == 6
        results = await asyncio.gather(
            left.register_run(RunRecord(run_id='r0', agent_name='left')),
            right.register_run(RunRecord(run_id='r0', agent_name='right')),
            return_exceptions=True,
        )
        assert sorted(type(result).__name__ for result in results) == ['NoneType', 'ValueError']


@pytest.mark.parametrize('first_commits', [True, False], ids=['first commits', 'first rolls back'])
async def test_a_first_write_waits_for_another_connections_first_write(
    postgres_database: EmptyDatabase, first_commits: bool
) -> None:
    engine = create_async_engine(postgres_database.url)
    first_event = StepEvent(run_id='new', kind='run_started', step_index=0, timestamp=T0)
    second_event = StepEvent(run_id='new', kind='model_request_started', step_index=1)
    try:
        async with SqlStepStore(engine) as store:
            await store.migrate()
        async with engine.connect() as first:
            transaction = await first.begin()
            await SqlStepStore(first, auto_migrate=False).append_event(first_event)
            async with SqlStepStore(engine) as other:
                racing = asyncio.create_task(other.append_event(second_event))
                await wait_until_a_connection_waits_for_a_lock(engine)
                assert not racing.done()
                await (transaction.commit() if first_commits else transaction.rollback())
                await racing
                record = await other.get_run(run_id='new')
                stored = await other.list_events(run_id='new')
    finally:
        await engine.dispose()
    if first_commits:
        assert (record, stored) == (RunRecord(run_id='new', started_at=T0), [first_event, second_event])
    else:
        assert (record, stored) == (RunRecord(run_id='new', started_at=second_event.timestamp), [second_event])


@pytest.mark.parametrize('media_store', [None, 'auto'], ids=['inline', 'media table'])
async def test_a_save_to_a_run_another_store_deleted_registers_it_bare(
    empty_database: EmptyDatabase, media_store: str | None
) -> None:
    """This store's cached head is of the deleted registration: the save finds no run, registers it bare and
    stores its history from no view (after packing it again, with a media store)."""
    history = sample_history(2, tag='again')
    async with SqlStepStore(empty_database.url, media_store=media_store) as writer:
        await writer.register_run(RunRecord(run_id='gone', agent_name='agent'))
        await writer.save_snapshot(ContinuableSnapshot(run_id='gone', step_index=1, messages=sample_history(1)))
        async with SqlStepStore(empty_database.url) as other:
            await other.delete_run(run_id='gone')
        again = ContinuableSnapshot(run_id='gone', step_index=2, messages=history, timestamp=T0)
        await writer.save_snapshot(again)
        assert await writer.get_run(run_id='gone') == RunRecord(run_id='gone', started_at=T0)
        assert await writer.list_snapshots(run_id='gone') == [again]
        await writer.save_snapshot(again.model_copy(update={'step_index': 3}))
        assert [s.seq for s in await writer.list_snapshots(run_id='gone')] == [1, 2]
