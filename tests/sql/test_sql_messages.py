"""Each distinct message of a run is stored once; snapshots refer to message numbers."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart
from sqlalchemy import Text, cast, func, select
from sqlalchemy.ext.asyncio import create_async_engine

from sql.databases import EmptyDatabase
from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore
from step_persistence._history import HistoryEncoder
from step_persistence.stores.sql.schema import messages, snapshots
from step_persistence.testing.conformance import sample_history

pytestmark = pytest.mark.anyio


def dump(history: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(history, mode='json')


def snapshot(run_id: str, history: list[ModelMessage], step: int, encoder: HistoryEncoder) -> ContinuableSnapshot:
    return ContinuableSnapshot.from_encoded(
        run_id=run_id,
        step_index=step,
        messages=history,
        encoded=encoder.encode(history).messages,
        state='complete',
        conversation_id=None,
        parent_run_id=None,
        agent_name=None,
        idempotency_key=None,
    )


async def stored(url: str, run_id: str) -> tuple[int, int, list[Any]]:
    """Message rows, total message body length, and every snapshot's message references."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            count, size = (
                await connection.execute(
                    select(func.count(), func.sum(func.length(cast(messages.c.body, Text)))).where(
                        messages.c.run_id == run_id
                    )
                )
            ).one()
            refs = (
                await connection.execute(
                    select(snapshots.c.message_refs).where(snapshots.c.run_id == run_id).order_by(snapshots.c.seq)
                )
            ).scalars()
            return count, size, list(refs)
    finally:
        await engine.dispose()


async def test_a_run_of_k_steps_writes_each_message_once(empty_database: EmptyDatabase) -> None:
    steps = 30
    history = sample_history(steps, tag='long')
    encoder = HistoryEncoder()
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='long'))
        for step in range(1, steps + 1):
            await store.save_snapshot(snapshot('long', history[: 2 * step + 1], step, encoder))
        latest = await store.latest_snapshot(run_id='long')
        assert latest is not None and dump(latest.messages) == dump(history)
    count, size, refs = await stored(empty_database.url, 'long')
    assert count == len(history)
    assert size <= sum(len(message.data) for message in encoder.encode(history).messages) + count * 2
    assert refs == [[[1, 2 * step + 1]] for step in range(1, steps + 1)], 'one range per snapshot: O(1) each'


async def test_a_second_store_on_the_same_run_reuses_the_stored_messages(empty_database: EmptyDatabase) -> None:
    history = sample_history(4, tag='shared')
    async with SqlStepStore(empty_database.url) as first:
        await first.register_run(RunRecord(run_id='shared'))
        await first.save_snapshot(snapshot('shared', history[:5], 2, HistoryEncoder()))
    async with SqlStepStore(empty_database.url) as second:
        await second.save_snapshot(snapshot('shared', history, 4, HistoryEncoder()))
        snapshots_read = await second.list_snapshots(run_id='shared')
        assert [dump(s.messages) for s in snapshots_read] == [dump(history[:5]), dump(history)]
    count, _, _ = await stored(empty_database.url, 'shared')
    assert count == len(history)


async def test_a_run_deleted_and_registered_again_elsewhere_is_not_confused_with_the_old_one(
    empty_database: EmptyDatabase,
) -> None:
    old, new = sample_history(2, tag='old'), sample_history(1, tag='new')
    async with SqlStepStore(empty_database.url) as writer, SqlStepStore(empty_database.url) as other:
        await writer.register_run(RunRecord(run_id='reused'))
        await writer.save_snapshot(snapshot('reused', old, 2, HistoryEncoder()))
        await other.delete_run(run_id='reused')
        await other.register_run(RunRecord(run_id='reused'))
        await other.save_snapshot(snapshot('reused', new, 1, HistoryEncoder()))
        extended = [*old, ModelRequest(parts=[UserPromptPart(content='and then')])]
        await writer.save_snapshot(snapshot('reused', extended, 3, HistoryEncoder()))
        assert [dump(s.messages) for s in await other.list_snapshots(run_id='reused')] == [dump(new), dump(extended)]


async def test_a_shared_connection_also_writes_each_message_once(empty_database: EmptyDatabase) -> None:
    history = sample_history(3, tag='conn')
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.begin() as connection:
            store = SqlStepStore(connection)
            await store.register_run(RunRecord(run_id='conn'))
            for step in range(1, 4):
                await store.save_snapshot(snapshot('conn', history[: 2 * step + 1], step, HistoryEncoder()))
    finally:
        await engine.dispose()
    count, _, refs = await stored(empty_database.url, 'conn')
    assert count == len(history)
    assert refs == [[[1, 3]], [[1, 5]], [[1, 7]]]
