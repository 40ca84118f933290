"""Concurrent writers on one Mongo database: separate stores and clients stand in for separate processes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from step_persistence import ContinuableSnapshot, MongoStepStore, RunRecord, SnapshotState, StepEvent
from step_persistence.retention import retained_seqs
from step_persistence.testing.conformance import sample_history
from support.mongo_helpers import scratch, store_in
from support.servers.mongo import MongoServer, Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio


@pytest.fixture
async def motor_scratch(mongo_server: MongoServer) -> AsyncIterator[Scratch]:
    async with mongo_server.scratch('motor') as made:
        yield made


def keyed_snapshot(run_id: str, key: str, state: SnapshotState) -> ContinuableSnapshot:
    return ContinuableSnapshot(
        run_id=run_id, step_index=1, messages=sample_history(1), state=state, idempotency_key=key
    )


async def test_duplicate_registration_from_two_clients_admits_exactly_one(
    scratch: Scratch, motor_scratch: Scratch
) -> None:
    database = scratch.fresh_database()
    stores = [store_in(scratch, database), MongoStepStore(client=motor_scratch.client, database=database)]
    for round_number in range(5):
        run_id = f'race-{round_number}'
        attempts = [RunRecord(run_id=run_id, agent_name=f'writer-{index}') for index in range(2)]
        results = await asyncio.gather(
            *(store.register_run(attempt) for store, attempt in zip(stores, attempts, strict=True)),
            return_exceptions=True,
        )
        winners = [attempt for attempt, result in zip(attempts, results, strict=True) if result is None]
        assert len(winners) == 1, results
        assert all(isinstance(result, ValueError) for result in results if result is not None), results
        assert await stores[1].get_run(run_id=run_id) == winners[0]


async def test_concurrent_saves_from_three_stores_keep_exactly_what_retention_keeps(
    mongo_server: MongoServer, scratch: Scratch
) -> None:
    database = scratch.fresh_database()
    async with mongo_server.scratch() as second, mongo_server.scratch() as third:
        stores = [
            store_in(client_scratch, database, max_snapshots_per_run=2) for client_scratch in (scratch, second, third)
        ]
        await stores[0].register_run(RunRecord(run_id='crowd'))
        states: dict[str, SnapshotState] = {
            f'{writer}-{n}': 'complete' if n % 3 == 0 else 'interrupted' for writer in range(3) for n in range(8)
        }
        await asyncio.gather(
            *(stores[int(key[0])].save_snapshot(keyed_snapshot('crowd', key, state)) for key, state in states.items())
        )
        documents = await scratch.client[database]['snapshots'].find({'run_id': 'crowd'}).to_list(None)
    seq_of = {document['idempotency_key']: document['seq'] for document in documents}
    assert sorted(seq_of.values()) == list(range(1, len(states) + 1))
    expected = retained_seqs([(seq_of[key], state) for key, state in states.items()], 2)
    retained = await stores[0].list_snapshots(run_id='crowd', include_interrupted=True)
    assert {snapshot.seq for snapshot in retained} == expected


class GatedDeletes:
    """Forwards to a collection, holding `update_many`/`delete_many` until `gate` is set."""

    def __init__(self, inner: Any, gate: asyncio.Event) -> None:
        self._inner = inner
        self._gate = gate
        self.reached = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def update_many(self, *args: Any, **kwargs: Any) -> Any:
        self.reached.set()
        await self._gate.wait()
        return await self._inner.update_many(*args, **kwargs)

    async def delete_many(self, *args: Any, **kwargs: Any) -> Any:
        self.reached.set()
        await self._gate.wait()
        return await self._inner.delete_many(*args, **kwargs)


async def test_pruning_never_deletes_a_snapshot_saved_after_it_looked(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    slow, fast = (store_in(scratch, database, max_snapshots_per_run=1) for _ in range(2))
    await fast.register_run(RunRecord(run_id='run'))
    await fast.save_snapshot(keyed_snapshot('run', 'first', 'complete'))
    gate = asyncio.Event()
    writer = slow._on_loop.get().writer  # what `slow` writes with on this loop
    gated = GatedDeletes(writer._snapshots, gate)
    writer._snapshots = gated  # type: ignore[assignment]
    # `slow` saves seq 2, reads {1, 2} and decides to drop 1, then waits before deleting.
    pruning = asyncio.create_task(slow.save_snapshot(keyed_snapshot('run', 'second', 'complete')))
    await asyncio.wait_for(gated.reached.wait(), timeout=60)
    # Meanwhile `fast` saves seq 3 and prunes everything older.
    await fast.save_snapshot(keyed_snapshot('run', 'third', 'complete'))
    gate.set()
    await pruning
    retained = await fast.list_snapshots(run_id='run', include_interrupted=True)
    assert [snapshot.idempotency_key for snapshot in retained] == ['third']


async def test_a_write_whose_caller_is_cancelled_still_lands_before_later_calls(scratch: Scratch) -> None:
    store = store_in(scratch)
    await store.register_run(RunRecord(run_id='order'))
    first = asyncio.create_task(store.append_event(StepEvent(run_id='order', kind='tool_call_completed', step_index=1)))
    await asyncio.sleep(0)
    first.cancel()
    await store.append_event(StepEvent(run_id='order', kind='tool_call_failed', step_index=1))
    with pytest.raises(asyncio.CancelledError):
        await first
    kinds = [event.kind for event in await store.list_events(run_id='order')]
    assert kinds == ['tool_call_completed', 'tool_call_failed']


async def test_a_write_whose_caller_is_cancelled_logs_its_failure(
    scratch: Scratch, caplog: pytest.LogCaptureFixture
) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='damaged'))
    await scratch.client[database]['counters'].update_one({'_id': 'damaged'}, {'$set': {'registration': 'text'}})
    write = asyncio.create_task(store.append_event(StepEvent(run_id='damaged', kind='run_started', step_index=0)))
    await asyncio.sleep(0)
    write.cancel()
    with caplog.at_level(logging.WARNING, logger='step_persistence'), pytest.raises(asyncio.CancelledError):
        await write
    assert any('caller was cancelled failed' in record.getMessage() for record in caplog.records)
    assert any('counters document of run' in record.getMessage() for record in caplog.records)


async def test_aclose_waits_for_a_write_whose_cancelled_caller_is_not_awaited(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='closing'))
    write = asyncio.create_task(
        store.append_event(StepEvent(run_id='closing', kind='tool_call_completed', step_index=1))
    )
    await asyncio.sleep(0)
    write.cancel()
    await store.aclose()
    assert [event.kind for event in await store_in(scratch, database).list_events(run_id='closing')] == [
        'tool_call_completed'
    ]
    with pytest.raises(asyncio.CancelledError):
        await write
