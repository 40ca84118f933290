"""Round trips per write on MongoDB, counted with a command listener, and the numbering they rely on.

A tool step is two batches (the started effect before the tool body, then its completion, events
and snapshot). On a server with the client-level `bulkWrite` (MongoDB 8.0+, as SecantusDB reports)
each batch is one command, its numbers taken from the counters the store remembers (`claim`,
`_counters.py`); on an older server (forced here by raising the wire version the store asks for)
each batch allocates, then writes each collection. Both ways must number events and snapshots
1, 2, 3, ... per run whoever writes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.write_concern import WriteConcern

from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, StepPersistence, ToolEffectRecord
from step_persistence.records import StepWrites
from step_persistence.stores.mongo import MongoStepStore
from step_persistence.stores.mongo import _ordered_writes as ordered_writes
from step_persistence.testing.conformance import sample_history
from support.mongo_helpers import CommandLog, scratch, store_in
from support.scripted import calls, scripted, text
from support.servers.mongo import MongoServer, Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio

HISTORIES = [sample_history(turns) for turns in range(5)]
"""Histories of 0-4 tool cycles (made once: a history's timestamps are those of when it was made)."""


@pytest.fixture(params=['client bulkWrite', 'per collection'])
def client_bulk_write(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether stores send a batch as one client `bulkWrite`; 'per collection' stands in for a server before 8.0."""
    if request.param == 'per collection':
        monkeypatch.setattr(ordered_writes, 'CLIENT_BULK_WRITE_WIRE_VERSION', 10**6)
        return False
    return True


@pytest.fixture
async def logged(mongo_server: MongoServer) -> AsyncIterator[tuple[CommandLog, Any]]:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    try:
        yield log, client
    finally:
        await client.close()


async def tool_steps(store: MongoStepStore, steps: int) -> None:
    """One agent run of `steps` sequential tool calls, then a final answer."""
    script = [calls(('lookup', {'step': step}, f'call-{step}')) for step in range(steps)]
    agent = Agent(scripted(*script, text('done')), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def lookup(step: int) -> str:
        return f'result {step}'

    await agent.run('go')


async def commands_per_step(log: CommandLog, store: MongoStepStore) -> Counter[tuple[str, Any]]:
    """The commands each further tool step adds: a run of 5 steps minus a run of 2, over 3 (warmed up first)."""
    await tool_steps(store, 1)
    counted = []
    for steps in (2, 5):
        log.commands.clear()
        await tool_steps(store, steps)
        counted.append(Counter((name, collection) for name, collection, _ in log.commands))
    added = counted[1] - counted[0]
    assert counted[0] - counted[1] == Counter(), 'a longer run sends every command of a shorter one'
    assert all(number % 3 == 0 for number in added.values()), added
    return Counter({command: number // 3 for command, number in added.items()})


async def test_a_tool_step_is_two_round_trips_with_client_bulk_write(
    logged: tuple[CommandLog, Any], scratch: Scratch
) -> None:
    log, client = logged
    store = MongoStepStore(client=client, database=scratch.fresh_database())
    per_step = await commands_per_step(log, store)
    assert sum(per_step.values()) <= 3, per_step
    assert per_step == Counter({('bulkWrite', 1): 2}), 'one command per batch, its numbers claimed in it'


async def test_before_mongodb_8_a_tool_step_allocates_then_writes_each_collection(
    logged: tuple[CommandLog, Any], scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ordered_writes, 'CLIENT_BULK_WRITE_WIRE_VERSION', 10**6)
    log, client = logged
    store = MongoStepStore(client=client, database=scratch.fresh_database())
    per_step = await commands_per_step(log, store)
    assert per_step == Counter(
        {
            ('findAndModify', 'counters'): 2,
            ('update', 'tool_effects'): 2,
            ('insert', 'events'): 2,
            ('insert', 'messages'): 1,
            ('insert', 'snapshots'): 1,
        }
    )


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def event(run_id: str, index: int, key: str | None = None) -> StepEvent:
    return StepEvent(run_id=run_id, kind='tool_call_completed', step_index=index, idempotency_key=key)


async def event_seqs(scratch: Scratch, database: str, run_id: str) -> list[int]:
    documents = await scratch.client[database]['events'].find({'run_id': run_id}).sort('seq', 1).to_list(None)
    return [document['seq'] for document in documents]


async def test_stores_taking_turns_on_one_run_number_its_writes_without_gaps(
    mongo_server: MongoServer, scratch: Scratch, client_bulk_write: bool
) -> None:
    """Each store remembers the counters it last saw; the other's writes make that memory stale."""
    database = scratch.fresh_database()
    async with mongo_server.scratch() as other:
        first, second = store_in(scratch, database), store_in(other, database)
        await first.register_run(RunRecord(run_id='r'))
        for turn in range(3):
            for store in (first, second, second, first):
                await store.write_batch(
                    StepWrites(
                        tool_effects=[
                            ToolEffectRecord(run_id='r', tool_call_id=f'c{turn}', tool_name='t', status='started')
                        ],
                        events=[event('r', turn), event('r', turn)],
                        snapshots=[ContinuableSnapshot(run_id='r', step_index=turn, messages=HISTORIES[turn])],
                    )
                )
        assert await event_seqs(scratch, database, 'r') == list(range(1, 25))
        snapshots = await second.list_snapshots(run_id='r')
        assert [snapshot.seq for snapshot in snapshots] == list(range(1, 13))
        assert [len(snapshot.messages) for snapshot in snapshots] == [
            len(HISTORIES[n]) for n in range(3) for _ in range(4)
        ]


async def test_concurrent_writers_of_one_run_number_its_events_without_gaps_or_repeats(
    mongo_server: MongoServer, scratch: Scratch, client_bulk_write: bool
) -> None:
    database = scratch.fresh_database()
    async with mongo_server.scratch() as other:
        stores = [store_in(scratch, database), store_in(other, database), store_in(scratch, database)]
        await stores[0].register_run(RunRecord(run_id='r'))
        for store in stores:
            await store.append_event(event('r', 0))  # each store now remembers some counters
        await asyncio.gather(
            *(
                store.write_batch(StepWrites(events=[event('r', n), event('r', n)]))
                for n in range(8)
                for store in stores
            )
        )
        assert await event_seqs(scratch, database, 'r') == list(range(1, 3 + 8 * 3 * 2 + 1))


@pytest.mark.parametrize('registered_again', [False, True], ids=['bare', 'registered again'])
@pytest.mark.parametrize('first', ['event', 'snapshot'])
async def test_a_run_deleted_by_another_store_is_numbered_from_one_again(
    mongo_server: MongoServer, scratch: Scratch, client_bulk_write: bool, first: str, registered_again: bool
) -> None:
    """The writer remembers the old run's counters and head; its next write finds them stale."""
    database = scratch.fresh_database()
    async with mongo_server.scratch() as other:
        writer, deleter = store_in(scratch, database), store_in(other, database)
        await writer.register_run(RunRecord(run_id='r', agent_name='old'))
        await writer.append_event(event('r', 0))
        await writer.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=HISTORIES[1]))
        await deleter.delete_run(run_id='r')
        if registered_again:
            await deleter.register_run(RunRecord(run_id='r', agent_name='new'))
        writes = [
            writer.append_event(event('r', 1)),
            writer.save_snapshot(ContinuableSnapshot(run_id='r', step_index=2, messages=HISTORIES[2])),
        ]
        for write in writes if first == 'event' else reversed(writes):
            await write
        run = await deleter.get_run(run_id='r')
        assert run is not None and run.agent_name == ('new' if registered_again else None)
        assert await event_seqs(scratch, database, 'r') == [1]
        [saved] = await deleter.list_snapshots(run_id='r')
        assert (saved.seq, dump(saved.messages)) == (1, dump(HISTORIES[2]))


async def test_a_write_error_the_batch_cannot_go_past_is_raised_and_numbering_goes_on(
    scratch: Scratch, client_bulk_write: bool
) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='r'))
    await store.append_event(event('r', 0))
    await scratch.client[database]['events'].insert_one({'run_id': 'r', 'seq': 2})  # damage: the next number taken
    effect = ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', status='started')
    with pytest.raises(OperationFailure, match='E11000'):
        await store.write_batch(StepWrites(tool_effects=[effect], events=[event('r', 1)]))
    assert await store.get_tool_effect(run_id='r', tool_call_id='c') == effect, 'what came before it landed'
    await store.append_event(event('r', 2))
    assert await event_seqs(scratch, database, 'r') == [1, 2, 3]


@pytest.mark.parametrize('client_bulk_write', [True, False], ids=['client bulkWrite', 'per collection'])
async def test_a_write_concern_error_is_raised(scratch: Scratch, client_bulk_write: bool) -> None:
    """SecantusDB is a one-node replica set: `w=2` cannot be satisfied (the writes themselves are applied)."""
    name = scratch.fresh_database()
    database = scratch.client.get_database(name, write_concern=WriteConcern(w=2, wtimeout=200))
    writes = ordered_writes.OrderedWrites(database, client_bulk_write=client_bulk_write)
    operations = [ordered_writes.Insert('events', {'seq': 1}), ordered_writes.Insert('snapshots', {'seq': 1})]
    with pytest.raises(PyMongoError, match='data-bearing nodes'):
        await writes.send(operations)


async def test_a_replayed_idempotency_key_is_skipped_and_the_rest_of_the_batch_lands(
    scratch: Scratch, client_bulk_write: bool
) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='r'))
    await store.write_batch(StepWrites(events=[event('r', 0, 'a')]))
    await store.write_batch(
        StepWrites(
            events=[event('r', 1, 'a'), event('r', 2, 'b')],
            snapshots=[
                ContinuableSnapshot(run_id='r', step_index=1, messages=HISTORIES[1], idempotency_key='s'),
                ContinuableSnapshot(run_id='r', step_index=2, messages=HISTORIES[2], idempotency_key='s'),
            ],
        )
    )
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=3, messages=HISTORIES[3], idempotency_key='s'))
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=4, messages=HISTORIES[4]))
    events = await store.list_events(run_id='r')
    assert [(item.idempotency_key, item.step_index) for item in events] == [('a', 0), ('b', 2)]
    snapshots = await store.list_snapshots(run_id='r')
    assert [(snapshot.step_index, dump(snapshot.messages)) for snapshot in snapshots] == [
        (1, dump(HISTORIES[1])),
        (4, dump(HISTORIES[4])),
    ]


@pytest.fixture(scope='module')
def server_with_test_commands() -> Iterator[str]:
    """A SecantusDB server of this test's own, which takes `configureFailPoint` (the session's does not)."""
    from secantus import SecantusDBServer

    with SecantusDBServer(storage_path=':memory:', host='127.0.0.1', port=0) as server:
        yield server.uri


@pytest.mark.parametrize('code', [59, 115], ids=['CommandNotFound', 'CommandNotSupported'])
async def test_a_server_refusing_client_bulk_write_is_written_per_collection(
    server_with_test_commands: str, code: int
) -> None:
    """As MongoDB 8.0 does while its feature compatibility version is still 7.0."""
    log = CommandLog()
    client: Any = AsyncMongoClient(server_with_test_commands, appName='refuses-bulk-write', event_listeners=[log])
    try:
        failing = {'failCommands': ['bulkWrite'], 'errorCode': code, 'appName': 'refuses-bulk-write'}
        await client.admin.command('configureFailPoint', 'failCommand', mode='alwaysOn', data=failing)
        store = MongoStepStore(client=client, database=f'refusing_{code}')
        await store.register_run(RunRecord(run_id='r'))
        for index in range(3):
            await store.append_event(event('r', index))
        assert [item.step_index for item in await store.list_events(run_id='r')] == [0, 1, 2]
        assert log.named('bulkWrite') == [1], 'refused once, then never sent again'
        assert log.named('insert').count('events') == 3
    finally:
        await client.close()
