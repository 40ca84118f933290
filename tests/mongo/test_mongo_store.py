"""MongoStepStore specifics: construction and ownership, document layout, message storage, damaged documents."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart
from pymongo import MongoClient
from pymongo.errors import InvalidOperation

from step_persistence import (
    ContinuableSnapshot,
    MongoStepStore,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
    from_spec,
)
from step_persistence.stores.mongo.media_store import MongoMediaStore
from step_persistence.testing.conformance import sample_history
from support.mongo_helpers import any_scratch, scratch, snapshot, store_in
from support.servers.mongo import MongoServer, Scratch

__all__ = ['any_scratch', 'scratch']

pytestmark = pytest.mark.anyio


def dump(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode='json')


# --- construction and ownership ---


@pytest.mark.parametrize('arguments', [{}, {'client': object(), 'db_url': 'mongodb://127.0.0.1:1/'}])
def test_exactly_one_of_client_and_db_url(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match='exactly one of client'):
        MongoStepStore(database='db', **arguments)


def test_a_synchronous_client_is_refused() -> None:
    client: MongoClient[Any] = MongoClient('mongodb://127.0.0.1:1/', connect=False)
    try:
        with pytest.raises(TypeError, match='block the event loop'):
            MongoStepStore(client=client, database='db')
    finally:
        client.close()


@pytest.mark.parametrize(
    ('arguments', 'message'),
    [
        ({'db_url': 'postgresql://host/db', 'database': 'db'}, 'mongodb:// or mongodb\\+srv://'),
        ({'db_url': 'mongodb://127.0.0.1:1/', 'database': 'a.b'}, 'invalid MongoDB database name'),
        ({'db_url': 'mongodb://127.0.0.1:1/', 'database': ''}, 'non-empty str'),
        ({'db_url': 'mongodb://127.0.0.1:1/', 'database': 'db', 'max_snapshots_per_run': 0}, 'max_snapshots'),
        ({'db_url': 'mongodb://127.0.0.1:1/', 'database': 'db', 'media_threshold_bytes': 0}, 'threshold'),
    ],
)
def test_bad_arguments_are_value_errors(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MongoStepStore(**arguments)


@pytest.mark.parametrize('url', ['postgresql://app:s3cret@host/db', 'mongodb+other://app:s3cret@host/db'])
def test_a_refused_url_is_shown_without_its_password(url: str) -> None:
    with pytest.raises(ValueError, match='mongodb:// or mongodb\\+srv://') as refused:
        MongoStepStore(db_url=url, database='db')
    assert 's3cret' not in str(refused.value) and 'app:***@host' in str(refused.value)


async def test_the_url_scheme_may_be_written_in_any_case(mongo_server: MongoServer, scratch: Scratch) -> None:
    scheme, _, rest = mongo_server.uri.partition('://')
    async with MongoStepStore(db_url=f'{scheme.upper()}://{rest}', database=scratch.fresh_database()) as store:
        await store.register_run(RunRecord(run_id='upper-case-scheme'))
        assert await store.get_run(run_id='upper-case-scheme') is not None


async def test_a_store_built_from_a_url_closes_its_client(mongo_server: MongoServer, scratch: Scratch) -> None:
    store = MongoStepStore(db_url=mongo_server.uri, database=scratch.fresh_database())
    await store.register_run(RunRecord(run_id='owned'))
    await store.aclose()
    with pytest.raises(InvalidOperation):
        await store.client.admin.command('ping')
    media = MongoMediaStore(db_url=mongo_server.uri, database=scratch.fresh_database())
    await media.put(b'owned blob')
    await media.aclose()
    with pytest.raises(InvalidOperation):
        await media.exists('media+sha256://' + '0' * 64)


async def test_a_passed_client_is_never_closed(any_scratch: Scratch) -> None:
    database = any_scratch.fresh_database()
    async with store_in(any_scratch, database) as store:
        assert store.client is any_scratch.client
        assert isinstance(store.media_store, MongoMediaStore)
        await store.register_run(RunRecord(run_id='borrowed'))
    async with MongoMediaStore(client=any_scratch.client, database=database) as media:
        await media.put(b'borrowed blob')
    assert (await any_scratch.client.admin.command('ping'))['ok'] == 1
    assert await store_in(any_scratch, database).get_run(run_id='borrowed') is not None


async def test_from_spec_builds_a_store_from_plain_values(mongo_server: MongoServer, scratch: Scratch) -> None:
    database = scratch.fresh_database()
    async with from_spec('mongo', db_url=mongo_server.uri, database=database, max_snapshots_per_run=3) as store:
        assert isinstance(store, MongoStepStore) and store.max_snapshots_per_run == 3
        await store.register_run(RunRecord(run_id='from-spec'))
    async with from_spec(mongo_server.uri_for(database)) as store:
        assert await store.get_run(run_id='from-spec') is not None
    with pytest.raises(ValueError, match='name the MongoDB database'):
        from_spec('mongodb://127.0.0.1:1/')
    with pytest.raises(ValueError, match='not both'):
        from_spec('mongodb://127.0.0.1:1/db', db_url='mongodb://127.0.0.1:1/')


# --- document layout ---


async def test_metadata_keys_round_trip_and_are_escaped_field_names(scratch: Scratch) -> None:
    metadata = {'plain': 'v', 'a.b': 'dot', '$set': 'dollar', 'nul\x00key': 'nul', '%2E': 'percent', '': 'empty'}
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='meta', metadata=metadata))
    await store.append_event(StepEvent(run_id='meta', kind='run_started', step_index=0, metadata=metadata))
    run = await store.get_run(run_id='meta')
    assert run is not None and run.metadata == metadata
    [event] = await store.list_events(run_id='meta')
    assert event.metadata == metadata
    stored = await scratch.client[database]['runs'].find_one({'_id': 'meta'})
    assert list(stored['metadata']) == ['plain', 'a%2Eb', '%24set', 'nul%00key', '%252E', '%']
    assert await scratch.client[database]['runs'].count_documents({'metadata.a%2Eb': 'dot'}) == 1


async def test_timestamps_are_dates_plus_microseconds(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    started = datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=UTC)
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='time', started_at=started))
    stored = await scratch.client[database]['runs'].find_one({'_id': 'time'})
    assert (stored['started_at'], stored['started_at_us']) == (datetime(2026, 3, 4, 5, 6, 7, 891000), 234)
    run = await store.get_run(run_id='time')
    assert run is not None and run.started_at == started


async def test_each_message_is_stored_once_and_snapshots_name_their_history_by_a_view(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database, media_store=None)
    for run_id in ('one', 'two'):
        await store.register_run(RunRecord(run_id=run_id))
    for turns in range(1, 5):
        await store.save_snapshot(snapshot('one', turns))
    await store.save_snapshot(snapshot('two', 1))
    messages = scratch.client[database]['messages']
    assert await messages.count_documents({'run_id': 'one'}) == len(sample_history(4))
    assert await messages.count_documents({'run_id': 'two'}) == len(sample_history(1))
    found = scratch.client[database]['snapshots'].find(
        {}, {'_id': 0, 'run_id': 1, 'line': 1, 'history_length': 1, 'through_message': 1, 'history_digest': 1}
    )
    views = {(document['run_id'], document['history_length']): document async for document in found}
    [line_one] = await messages.distinct('line', {'run_id': 'one'})
    [line_two] = await messages.distinct('line', {'run_id': 'two'})
    assert line_one != line_two, 'runs that share no history share no line'
    for turns in range(1, 5):
        view = views['one', 1 + 2 * turns]
        assert (view['line'], view['through_message']) == (line_one, 1 + 2 * turns)
        assert view['history_digest'] == snapshot('one', turns).history_digest()
    assert [len(s.messages) for s in await store.list_snapshots(run_id='one')] == [3, 5, 7, 9]


async def test_pruned_snapshots_with_keys_leave_tombstones(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database, max_snapshots_per_run=1)
    await store.register_run(RunRecord(run_id='tomb'))
    await store.save_snapshot(snapshot('tomb', 1, idempotency_key='k1'))
    await store.save_snapshot(snapshot('tomb', 2))
    await store.save_snapshot(snapshot('tomb', 3, idempotency_key='k3'))
    documents = await scratch.client[database]['snapshots'].find({}, {'_id': 0, 'seq': 1, 'pruned': 1}).to_list(None)
    assert sorted(documents, key=lambda d: d['seq']) == [{'seq': 1, 'pruned': True}, {'seq': 3}]
    await store.save_snapshot(snapshot('tomb', 4, idempotency_key='k1'))
    assert [s.step_index for s in await store.list_snapshots(run_id='tomb', include_interrupted=True)] == [3]


async def test_reads_create_nothing(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    assert await store.get_run(run_id='r') is None
    assert await store.list_runs() == []
    assert await store.list_events(run_id='r') == []
    assert await store.latest_snapshot(run_id='r', include_interrupted=True) is None
    assert await store.list_unresolved_tool_effects(run_id='r') == []
    await store.delete_run(run_id='r')
    assert await scratch.client[database].list_collection_names() == []


async def test_tool_effect_annotations_that_look_like_operators_round_trip(scratch: Scratch) -> None:
    store = store_in(scratch)
    await store.register_run(RunRecord(run_id='fx'))
    annotated = ToolEffectRecord(
        run_id='fx', tool_call_id='$t', tool_name='$set', status='started', idempotency_key='$inc', effect_summary='$$'
    )
    await store.record_tool_effect(annotated)
    await store.record_tool_effect(annotated.model_copy(update={'status': 'completed', 'effect_summary': None}))
    stored = await store.get_tool_effect(run_id='fx', tool_call_id='$t')
    assert stored == annotated.model_copy(update={'status': 'completed'})


# --- lifecycle of a run's documents ---


async def test_delete_run_removes_its_counters_and_messages(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    for run_id in ('gone', 'kept'):
        await store.register_run(RunRecord(run_id=run_id))
        await store.save_snapshot(snapshot(run_id, 1))
    await store.delete_run(run_id='gone')
    of_gone = {'$or': [{'_id': 'gone'}, {'run_id': 'gone'}]}
    for collection in ('runs', 'counters', 'messages', 'snapshots'):
        assert await scratch.client[database][collection].count_documents(of_gone) == 0
    assert await scratch.client[database]['messages'].count_documents({'run_id': 'kept'}) == 3


async def test_a_registration_interrupted_before_its_counters_is_repaired(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='half'))
    await scratch.client[database]['counters'].delete_one({'_id': 'half'})
    await store.append_event(StepEvent(run_id='half', kind='run_started', step_index=0))
    await store.save_snapshot(snapshot('half', 1))
    assert len(await store.list_events(run_id='half')) == 1
    assert len(await store.list_snapshots(run_id='half')) == 1


async def test_message_numbers_cached_before_a_run_was_registered_again_elsewhere(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    writer, other = store_in(scratch, database, media_store=None), store_in(scratch, database, media_store=None)
    await writer.register_run(RunRecord(run_id='again'))
    await writer.save_snapshot(snapshot('again', 2))
    await other.delete_run(run_id='again')
    await other.register_run(RunRecord(run_id='again'))
    rewritten = [ModelRequest(parts=[UserPromptPart(content='a different start')])]
    await other.save_snapshot(ContinuableSnapshot(run_id='again', step_index=1, messages=rewritten))
    await writer.save_snapshot(snapshot('again', 3))
    snapshots = await other.list_snapshots(run_id='again')
    assert [dump(s.messages) for s in snapshots] == [dump(rewritten), dump(sample_history(3))]


# --- damaged documents ---


async def test_damaged_documents_are_skipped_and_logged(scratch: Scratch, caplog: pytest.LogCaptureFixture) -> None:
    database = scratch.fresh_database()
    db = scratch.client[database]
    store = store_in(scratch, database, media_store=None)
    for run_id in ('good', 'bad'):
        await store.register_run(RunRecord(run_id=run_id))
    await store.append_event(StepEvent(run_id='good', kind='run_started', step_index=0))
    await store.append_event(StepEvent(run_id='good', kind='run_completed', step_index=1))
    for turns in (1, 2, 3):
        await store.save_snapshot(snapshot('good', turns))
    await store.record_tool_effect(ToolEffectRecord(run_id='good', tool_call_id='a', tool_name='t', status='started'))
    await store.record_tool_effect(ToolEffectRecord(run_id='good', tool_call_id='b', tool_name='t', status='started'))

    await db['runs'].update_one({'_id': 'bad'}, {'$set': {'started_at': 'yesterday'}})
    await db['events'].update_one({'run_id': 'good', 'seq': 1}, {'$set': {'kind': 'exploded'}})
    await db['snapshots'].update_one({'run_id': 'good', 'seq': 3}, {'$set': {'through_message': 'nonsense'}})
    await db['messages'].update_one({'run_id': 'good', 'no': 5}, {'$set': {'body': '{not json'}})
    await db['tool_effects'].update_one({'tool_call_id': 'b'}, {'$set': {'status': 'maybe'}})

    with caplog.at_level(logging.WARNING, logger='step_persistence'):
        assert [run.run_id for run in await store.list_runs()] == ['good']
        assert [event.kind for event in await store.list_events(run_id='good')] == ['run_completed']
        latest = await store.latest_snapshot(run_id='good')
        assert latest is not None and latest.step_index == 1
        assert [s.step_index for s in await store.list_snapshots(run_id='good')] == [1]
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id='good')] == ['a']
    skipped = ' '.join(record.getMessage() for record in caplog.records)
    for described in ("run 'bad'", "event 1 of run 'good'", "snapshot 3 of run 'good'", "snapshot 2 of run 'good'"):
        assert described in skipped


async def test_latest_snapshot_falls_back_past_a_page_of_unreadable_ones(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='deep'))
    for turns in range(1, 8):
        await store.save_snapshot(snapshot('deep', turns))
    await scratch.client[database]['snapshots'].update_many({'seq': {'$gte': 3}}, {'$set': {'history_length': 'three'}})
    latest = await store.latest_snapshot(run_id='deep')
    assert latest is not None and latest.seq == 2
