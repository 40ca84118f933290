"""Origins and anchors on SQL, where writers race: two PostgreSQL connections continuing one snapshot store
one continuation and one fork (also when one fills in a bare run); a save whose head's snapshot another
writer deleted stores its history anew; a delete of that snapshot waits for the save in flight and keeps
what it uses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore, StepEvent
from step_persistence.records import RunOrigin
from step_persistence.stores.sql.schema import messages
from step_persistence.testing.conformance.conversations import chat_history
from support.databases import EmptyDatabase, wait_until_a_connection_waits_for_a_lock

pytestmark = pytest.mark.anyio

CONTINUED = RunOrigin(kind='continued', run_id='head', seq=1)


def dump(history: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(history, mode='json')


@pytest.fixture
async def engine(postgres_database: EmptyDatabase) -> AsyncIterator[AsyncEngine]:
    """An engine on a migrated PostgreSQL database holding run `head` with one snapshot."""
    engine = create_async_engine(postgres_database.url)
    async with SqlStepStore(engine) as store:
        await store.register_run(RunRecord(run_id='head', conversation_id='chat'))
        await store.save_snapshot(ContinuableSnapshot(run_id='head', step_index=1, messages=chat_history(2)))
    yield engine
    await engine.dispose()


@pytest.mark.parametrize('first_commits', [True, False], ids=['first commits', 'first rolls back'])
@pytest.mark.parametrize('second_is_bare', [False, True], ids=['new', 'bare'])
async def test_two_connections_continuing_one_snapshot_store_one_continuation(
    engine: AsyncEngine, first_commits: bool, second_is_bare: bool
) -> None:
    """The second registration (an insert, or the fill of a bare run) waits on the partial unique index for
    the first transaction: stored as a fork if that one commits (a refused fill undone alone, in a
    savepoint), as the continuation if it rolls back; a bare run keeps the event it was registered by."""
    if second_is_bare:
        async with SqlStepStore(engine) as store:
            await store.append_event(StepEvent(run_id='tab-2', kind='run_started', step_index=0))
    async with engine.connect() as first, engine.connect() as second:
        first_transaction, second_transaction = await first.begin(), await second.begin()
        await SqlStepStore(first, auto_migrate=False).register_run(RunRecord(run_id='tab-1', origin=CONTINUED))
        racing = asyncio.create_task(
            SqlStepStore(second, auto_migrate=False).register_run(RunRecord(run_id='tab-2', origin=CONTINUED))
        )
        await wait_until_a_connection_waits_for_a_lock(engine)
        assert not racing.done()
        await (first_transaction.commit() if first_commits else first_transaction.rollback())
        await racing
        await second_transaction.commit()
    async with SqlStepStore(engine) as store:
        stored = {run.run_id: run.origin for run in await store.list_runs(origin_run_id='head')}
        events = [event.kind for event in await store.list_events(run_id='tab-2')]
        with pytest.raises(ValueError, match='tab-2'):
            await store.register_run(RunRecord(run_id='tab-2'))
    forked = CONTINUED.model_copy(update={'kind': 'forked'})
    assert stored == ({'tab-1': CONTINUED, 'tab-2': forked} if first_commits else {'tab-2': CONTINUED})
    assert events == (['run_started'] if second_is_bare else [])


async def test_a_delete_of_the_origin_waits_for_the_save_building_on_it(engine: AsyncEngine) -> None:
    """The save locks its head's snapshot (`FOR KEY SHARE`): deleting that snapshot's run waits for the save's
    commit, then keeps the rows the new snapshot uses."""
    history = [*chat_history(2), *chat_history(1, tag='-next', start=2)]
    async with engine.connect() as saving:
        transaction = await saving.begin()
        store = SqlStepStore(saving, auto_migrate=False)
        # Another conversation: the delete does not wait for this registration's summary row.
        await store.register_run(RunRecord(run_id='next', conversation_id='elsewhere', origin=CONTINUED))
        await store.save_snapshot(ContinuableSnapshot(run_id='next', step_index=1, messages=history))
        async with SqlStepStore(engine) as other:
            deleting = asyncio.create_task(other.delete_run(run_id='head'))
            await wait_until_a_connection_waits_for_a_lock(engine)
            assert not deleting.done()
            await transaction.commit()
            await deleting
            await other.collect_media(grace=timedelta(0))
            latest = await other.latest_snapshot(run_id='next')
            assert latest is not None and dump(latest.messages) == dump(history)
            assert await other.get_run(run_id='head') is None
    async with engine.connect() as connection:
        assert (await connection.execute(select(func.count()).select_from(messages))).scalar_one() == len(history)


@pytest.mark.parametrize('media_store', [None, 'auto'], ids=['inline', 'media table'])
async def test_a_continuation_whose_origin_is_gone_stores_its_whole_history(
    empty_database: EmptyDatabase, media_store: Any
) -> None:
    """This store's cached head of the origin is anchored on a snapshot another store deleted (and its rows
    collected): the save notices in its transaction and stores every message on a new line."""
    history = [*chat_history(2), *chat_history(1, tag='-next', start=2)]
    async with SqlStepStore(empty_database.url, media_store=media_store) as writer:
        await writer.register_run(RunRecord(run_id='head', conversation_id='chat'))
        await writer.save_snapshot(ContinuableSnapshot(run_id='head', step_index=1, messages=chat_history(2)))
        async with SqlStepStore(empty_database.url) as other:
            await other.delete_run(run_id='head')
            await other.collect_media(grace=timedelta(0))
        await writer.register_run(RunRecord(run_id='next', conversation_id='chat', origin=CONTINUED))
        await writer.save_snapshot(ContinuableSnapshot(run_id='next', step_index=1, messages=history))
        latest = await writer.latest_snapshot(run_id='next')
        assert latest is not None and dump(latest.messages) == dump(history)
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.connect() as connection:
            assert (await connection.execute(select(func.count()).select_from(messages))).scalar_one() == len(history)
    finally:
        await engine.dispose()


@pytest.mark.parametrize('media_store', [None, 'auto'], ids=['inline', 'media table'])
async def test_a_cached_head_whose_snapshot_another_store_pruned_is_read_again(
    empty_database: EmptyDatabase, media_store: Any
) -> None:
    """Another store saves a shorter history of the run, prunes the snapshot this store's head is the view of
    and collects the rows only that one used: this store's next save reads the run's head again."""
    longer, shorter = chat_history(3), chat_history(1, tag='-other')
    extended = [*longer, *chat_history(1, start=3)]
    async with SqlStepStore(empty_database.url, media_store=media_store) as writer:
        await writer.register_run(RunRecord(run_id='r'))
        await writer.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=longer))
        async with SqlStepStore(empty_database.url, max_snapshots_per_run=1) as other:
            await other.save_snapshot(ContinuableSnapshot(run_id='r', step_index=2, messages=shorter))
            assert (await other.collect_media(grace=timedelta(0))).messages == len(longer)
        await writer.save_snapshot(ContinuableSnapshot(run_id='r', step_index=3, messages=extended))
        snapshots = await writer.list_snapshots(run_id='r')
        assert [(s.step_index, dump(s.messages)) for s in snapshots] == [(2, dump(shorter)), (3, dump(extended))]
