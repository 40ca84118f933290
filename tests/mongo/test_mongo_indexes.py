"""Indexes: created once, on the first write, also over existing data; clear errors when data or indexes clash."""

from __future__ import annotations

from typing import Any

import pytest

from step_persistence import MongoStepStore, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.records import RunOrigin
from step_persistence.stores.mongo import IndexCreationError
from step_persistence.testing.conformance import sample_history
from support.mongo_helpers import CommandLog, explain, scratch, snapshot, store_in
from support.servers.mongo import MongoServer, Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio


async def write_a_little_of_everything(store: MongoStepStore, run_id: str) -> None:
    await store.register_run(RunRecord(run_id=run_id, conversation_id='c'))
    await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='k'))
    await store.save_snapshot(snapshot(run_id, 1, idempotency_key='s'))
    await store.record_tool_effect(ToolEffectRecord(run_id=run_id, tool_call_id='t', tool_name='x', status='started'))


async def test_indexes_are_created_once_on_the_first_write(mongo_server: MongoServer, scratch: Scratch) -> None:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    database = scratch.fresh_database()
    try:
        store = MongoStepStore(client=client, database=database, media_store=None)
        assert await store.list_runs() == []
        assert log.named('createIndexes') == []
        for run_id in ('a', 'b', 'c'):
            await write_a_little_of_everything(store, run_id)
        assert log.named('createIndexes') == [
            'runs',
            'events',
            'snapshots',
            'tool_effects',
            'messages',
            'conversations',
        ]
    finally:
        await client.close()

    db = scratch.client[database]
    runs = await db['runs'].index_information()
    order = [('started_at', 1), ('started_at_us', 1), ('registration', 1)]
    assert runs['started_at']['key'] == order
    for name, field in [
        ('conversation_started', 'conversation_id'),
        ('parent_started', 'parent_run_id'),
        ('agent_started', 'agent_name'),
        ('origin_started', 'origin.run_id'),
    ]:
        assert runs[name]['key'] == [(field, 1), *order]
    continued = runs['continued_origin']
    assert continued['key'] == [('origin.run_id', 1), ('origin.seq', 1)] and continued['unique']
    assert continued['partialFilterExpression'] == {'origin.kind': 'continued'}
    for collection in ('events', 'snapshots'):
        indexes = await db[collection].index_information()
        assert indexes['run_seq']['unique']
        keyed = indexes['run_idempotency_key']
        assert keyed['unique'] and keyed['partialFilterExpression'] == {'idempotency_key': {'$type': 'string'}}
    snapshots = await db['snapshots'].index_information()
    assert snapshots['run_state_seq']['key'] == [('run_id', 1), ('state', 1), ('seq', 1)]
    assert snapshots['line_through']['key'] == [('line', 1), ('through_message', 1)]
    assert snapshots['history_digest']['key'] == [('history_digest', 1), ('run_id', 1), ('seq', 1)]
    effects = await db['tool_effects'].index_information()
    assert effects['run_tool_call']['unique'] and effects['run_status']['key'] == [('run_id', 1), ('status', 1)]
    messages = await db['messages'].index_information()
    assert messages['line_no']['key'] == [('line', 1), ('no', 1)] and messages['line_no']['unique']
    assert messages['line_no']['partialFilterExpression'] == {'line': {'$type': 'string'}}
    assert messages['line_position_no']['key'] == [('line', 1), ('position', 1), ('no', -1)]
    assert messages['line_no_position']['key'] == [('line', 1), ('no', 1), ('position', 1)]
    conversations = await db['conversations'].index_information()
    assert conversations['last_started']['key'] == [('last.at', 1), ('last.us', 1), ('_id', 1)]
    assert 'lines' not in await db.list_collection_names(), 'no branch: no lines collection'


async def test_indexes_are_built_over_data_already_stored(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    await write_a_little_of_everything(store_in(scratch, database), 'old')
    for collection in ('runs', 'events', 'snapshots', 'tool_effects', 'messages'):
        await scratch.client[database][collection].drop_indexes()

    store = store_in(scratch, database)
    await write_a_little_of_everything(store, 'new')
    assert len(await scratch.client[database]['events'].index_information()) == 3
    for run_id in ('old', 'new'):
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and len(latest.messages) == len(sample_history(1))
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='k'))
        assert len(await store.list_events(run_id=run_id)) == 1


async def test_duplicates_block_a_unique_index_until_they_are_removed(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    events = scratch.client[database]['events']
    duplicate = {'run_id': 'dup', 'seq': 7, 'kind': 'run_started', 'idempotency_key': 'same'}
    await events.insert_many([dict(duplicate), {**duplicate, 'seq': 8}])

    store = store_in(scratch, database)
    with pytest.raises(IndexCreationError, match=rf'{database}\.events: the collection already holds documents'):
        await store.register_run(RunRecord(run_id='blocked'))
    assert await store.get_run(run_id='blocked') is None, 'nothing is written before the indexes exist'

    await events.delete_one({'seq': 8})
    await store.register_run(RunRecord(run_id='blocked'))
    assert 'run_idempotency_key' in await events.index_information()


async def test_an_index_of_the_same_name_with_other_options_is_reported(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    await scratch.client[database]['snapshots'].create_index([('run_id', 1), ('seq', 1)], name='run_seq')
    store = store_in(scratch, database)
    with pytest.raises(IndexCreationError, match=rf'{database}\.snapshots already exists .* drop it'):
        await store.register_run(RunRecord(run_id='clash'))


# --- the listings are served by indexes (query plans) ---


async def populated(store: MongoStepStore) -> None:
    """Runs of several conversations, agents, parents and origins, with snapshots."""
    for number in range(12):
        conversation = f'conversation-{number % 4}'
        origin = None if number < 4 else RunOrigin(kind='continued', run_id=f'run-{number - 4}', seq=1)
        record = RunRecord(
            run_id=f'run-{number}',
            conversation_id=conversation,
            agent_name=f'agent-{number % 3}',
            parent_run_id=None if number % 5 else 'run-0',
            origin=origin,
        )
        await store.register_run(record)
        await store.save_snapshot(snapshot(record.run_id, 1 + number // 4))


@pytest.mark.parametrize(
    ('call', 'expected'),
    [
        (
            lambda store: store.list_runs(conversation_id='conversation-1', limit=20, newest_first=True),
            {'runs': 'conversation_started'},
        ),
        (lambda store: store.list_runs(parent_run_id='run-0', limit=3), {'runs': 'parent_started'}),
        (lambda store: store.list_runs(agent_name='agent-1', newest_first=True), {'runs': 'agent_started'}),
        (lambda store: store.list_runs(origin_run_id='run-2'), {'runs': 'origin_started'}),
        (lambda store: store.list_runs(limit=5, newest_first=True), {'runs': 'started_at'}),
        (
            lambda store: store.list_conversations(limit=20),
            {'conversations': 'last_started', 'runs': 'conversation_started'},
        ),
        (lambda store: store.list_conversations(newest_first=False, limit=2), {'conversations': 'last_started'}),
        (lambda store: store.list_conversations(agent_name='agent-2'), {'runs': 'agent_started'}),
        (
            lambda store: store.find_snapshot(
                conversation_id='conversation-1', history_digest=snapshot('run-1', 1).history_digest()
            ),
            {'snapshots': 'history_digest'},
        ),
        (lambda store: store.latest_snapshot(run_id='run-5'), {'messages': 'line_position_no'}),
    ],
    ids=[
        'list_runs(conversation_id, limit, newest_first)',
        'list_runs(parent_run_id)',
        'list_runs(agent_name)',
        'list_runs(origin_run_id)',
        'list_runs()',
        'list_conversations(limit)',
        'list_conversations(oldest first)',
        'list_conversations(agent_name)',
        'find_snapshot',
        'a snapshot read through its lines',
    ],
)
async def test_listings_are_served_by_indexes(
    mongo_server: MongoServer, scratch: Scratch, call: Any, expected: dict[str, str]
) -> None:
    database = scratch.fresh_database()
    await populated(store_in(scratch, database, media_store=None))
    log = CommandLog()
    client = log.client(mongo_server.uri)
    try:
        assert await call(MongoStepStore(client=client, database=database, media_store=None))
    finally:
        await client.close()
    db = scratch.client[database]
    queries = [(collection, command) for name, collection, command in log.commands if name in ('find', 'aggregate')]
    assert {collection for collection, _ in queries} >= set(expected)
    for collection, command in queries:
        if collection == 'counters':
            continue  # found by `_id` (one that is not a string, which the test server scans for)
        stages = await explain(db, command)
        assert 'COLLSCAN' not in [stage for stage, _ in stages], (collection, command, stages)
        if collection in expected:
            assert ('IXSCAN', expected[collection]) in stages, (command, stages)


async def test_create_indexes_creates_every_index_ahead_of_the_writes(
    mongo_server: MongoServer, scratch: Scratch
) -> None:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    database = scratch.fresh_database()
    try:
        store = MongoStepStore(client=client, database=database, media_store=None)
        await store.create_indexes()
        created = log.named('createIndexes')
        for run_id in ('head', 'tab-1', 'tab-2'):  # the second tab branches: a `lines` document
            origin = None if run_id == 'head' else RunOrigin(kind='continued', run_id='head', seq=1)
            await store.register_run(RunRecord(run_id=run_id, conversation_id='c', origin=origin))
            await store.save_snapshot(snapshot(run_id, 1 if run_id == 'head' else 2))
        assert log.named('createIndexes') == created, 'nothing left to create'
    finally:
        await client.close()
    assert sorted(created) == sorted(
        ['runs', 'events', 'snapshots', 'tool_effects', 'messages', 'lines', 'conversations']
    )
    assert await scratch.client[database]['lines'].count_documents({}) == 1
