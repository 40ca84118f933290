"""Databases written before history lines (issue 17) still read, and the runs in them go on.

`write_legacy_run` writes documents by hand exactly as the store wrote them before lines existed
(compared field by field with that version's output when this test was written): messages
numbered per run (`{run_id, no, position, digest, body, externalized}`, the unique `(run_id, no)`
index), snapshots without `line` or `history_digest`, runs without `origin`, no `conversations`
summaries. Such a database must read back unchanged through a new store (which creates nothing
while it only reads), and its runs must go on: saving more of a run, continuing one of its
snapshots from a new run, deleting and collecting.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pymongo import ASCENDING, DESCENDING, IndexModel

from step_persistence import ContinuableSnapshot, MongoStepStore, RunRecord
from step_persistence._history import encode_messages
from step_persistence.records import ConversationSummary, RunOrigin, SnapshotState
from step_persistence.testing.conformance import sample_history
from support.mongo_helpers import scratch, store_in
from support.servers.mongo import Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def _millis(value: datetime) -> tuple[datetime, int]:
    """A timestamp as the store writes it: the date truncated to the millisecond, and the micros past it."""
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000), value.microsecond % 1000


async def create_legacy_indexes(db: Any) -> None:
    """The indexes the store created before lines existed."""

    def on(*fields: str) -> list[tuple[str, int]]:
        return [(field, ASCENDING) for field in fields]

    keyed = {'idempotency_key': {'$type': 'string'}}
    await db['runs'].create_indexes(
        [
            IndexModel(on('conversation_id'), name='conversation_id', sparse=True),
            IndexModel(on('parent_run_id'), name='parent_run_id', sparse=True),
            IndexModel(on('started_at', 'started_at_us', 'registration'), name='started_at'),
        ]
    )
    idempotency = IndexModel(
        on('run_id', 'idempotency_key'), name='run_idempotency_key', unique=True, partialFilterExpression=keyed
    )
    await db['events'].create_indexes([IndexModel(on('run_id', 'seq'), name='run_seq', unique=True), idempotency])
    await db['snapshots'].create_indexes(
        [
            IndexModel(on('run_id', 'seq'), name='run_seq', unique=True),
            IndexModel(on('run_id', 'state', 'seq'), name='run_state_seq'),
            idempotency,
        ]
    )
    await db['tool_effects'].create_indexes(
        [
            IndexModel(on('run_id', 'tool_call_id'), name='run_tool_call', unique=True),
            IndexModel(on('run_id', 'status'), name='run_status'),
        ]
    )
    await db['messages'].create_indexes(
        [
            IndexModel(on('run_id', 'no'), name='run_no', unique=True),
            IndexModel([('run_id', ASCENDING), ('position', ASCENDING), ('no', DESCENDING)], name='run_position_no'),
        ]
    )


async def write_legacy_run(
    db: Any,
    record: RunRecord,
    histories: list[list[ModelMessage]],
    *,
    registration: int,
    states: list[SnapshotState] | None = None,
    keep: list[int] | None = None,
) -> None:
    """Write a run, one `run_started` event and a snapshot per history, as the store did before lines.

    Each snapshot stores the positions whose message differs from the newest stored at that
    position, numbered per run. `keep`: the sequence numbers whose snapshots stay (the others were
    pruned, without an idempotency key: deleted), default all.
    """
    started, started_us = _millis(record.started_at)
    run: dict[str, Any] = {'_id': record.run_id, 'agent_name': record.agent_name, 'metadata': dict(record.metadata)}
    if record.conversation_id is not None:
        run['conversation_id'] = record.conversation_id
    if record.parent_run_id is not None:
        run['parent_run_id'] = record.parent_run_id
    run.update({'registration': registration, 'started_at': started, 'started_at_us': started_us})
    await db['runs'].insert_one(run)
    await db['counters'].update_one(
        {'_id': {'sequence': 'registrations'}}, {'$max': {'last': registration}}, upsert=True
    )
    await db['counters'].insert_one(
        {'_id': record.run_id, 'registration': registration, 'event': 1, 'snapshot': len(histories)}
    )
    event_at, event_us = _millis(record.started_at)
    await db['events'].insert_one(
        {
            'run_id': record.run_id,
            'seq': 1,
            'kind': 'run_started',
            'step_index': 0,
            'conversation_id': record.conversation_id,
            'parent_run_id': record.parent_run_id,
            'agent_name': record.agent_name,
            'tool_call_id': None,
            'tool_name': None,
            'error': None,
            'metadata': {},
            'idempotency_key': None,
            'timestamp': event_at,
            'timestamp_us': event_us,
        }
    )
    latest: list[str] = []
    number = 0
    for seq, history in enumerate(histories, start=1):
        for position, message in enumerate(encode_messages(history)):
            if position < len(latest) and latest[position] == message.digest:
                continue
            number += 1
            await db['messages'].insert_one(
                {
                    'run_id': record.run_id,
                    'no': number,
                    'position': position,
                    'digest': message.digest,
                    'body': message.data.decode(),
                    'externalized': False,
                }
            )
            if position < len(latest):
                latest[position] = message.digest
            else:
                latest.append(message.digest)
        if keep is not None and seq not in keep:
            continue
        at, at_us = _millis(record.started_at + timedelta(seconds=seq))
        await db['snapshots'].insert_one(
            {
                'run_id': record.run_id,
                'seq': seq,
                'step_index': seq,
                'conversation_id': record.conversation_id,
                'parent_run_id': record.parent_run_id,
                'agent_name': record.agent_name,
                'state': 'complete' if states is None else states[seq - 1],
                'idempotency_key': None,
                'history_length': len(history),
                'through_message': number,
                'timestamp': at,
                'timestamp_us': at_us,
            }
        )


RUN = RunRecord(run_id='old-a', conversation_id='chat', agent_name='bot', metadata={'k': 'v'}, started_at=T0)
OTHER = RunRecord(run_id='old-b', parent_run_id='old-a', started_at=T0 + timedelta(minutes=1))


async def legacy_database(scratch: Scratch) -> str:
    """A database as the store left it before lines: `old-a` (two snapshots, a conversation) and `old-b`."""
    database = scratch.fresh_database()
    db = scratch.client[database]
    await create_legacy_indexes(db)
    await write_legacy_run(db, RUN, [sample_history(1), sample_history(2)], registration=1)
    await write_legacy_run(db, OTHER, [sample_history(1, tag='b')], registration=2, states=['interrupted'])
    return database


async def histories(store: MongoStepStore, run_id: str) -> list[bytes]:
    return [dump(snapshot.messages) for snapshot in await store.list_snapshots(run_id=run_id, include_interrupted=True)]


async def test_a_database_written_before_lines_reads_back_and_reading_creates_nothing(scratch: Scratch) -> None:
    database = await legacy_database(scratch)
    db = scratch.client[database]
    collections = sorted(await db.list_collection_names())
    indexes = {name: await db[name].index_information() for name in collections}
    store = store_in(scratch, database)

    assert await store.get_run(run_id='old-a') == RUN
    assert await store.list_runs() == [RUN, OTHER]
    assert await store.list_runs(conversation_id='chat', newest_first=True, limit=5) == [RUN]
    assert await store.list_runs(parent_run_id='old-a') == [OTHER]
    assert await histories(store, 'old-a') == [dump(sample_history(1)), dump(sample_history(2))]
    assert await histories(store, 'old-b') == [dump(sample_history(1, tag='b'))]
    latest = await store.latest_snapshot(run_id='old-a')
    assert latest is not None and (latest.seq, dump(latest.messages)) == (2, dump(sample_history(2)))
    assert [event.kind for event in await store.list_events(run_id='old-a')] == ['run_started']
    summary = ConversationSummary(
        conversation_id='chat', first_started_at=T0, last_started_at=T0, run_count=1, head_run_id='old-a'
    )
    assert await store.list_conversations() == [summary]
    assert await store.list_conversations(agent_name='bot') == [summary]

    assert sorted(await db.list_collection_names()) == collections
    assert {name: await db[name].index_information() for name in collections} == indexes


async def test_the_first_write_drops_the_per_run_message_index_and_builds_conversation_summaries(
    scratch: Scratch,
) -> None:
    database = await legacy_database(scratch)
    db = scratch.client[database]
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='new', conversation_id='other', started_at=T0 + timedelta(hours=1)))
    messages = await db['messages'].index_information()
    assert 'run_no' not in messages and 'line_no' in messages
    assert 'run_position_no' in messages, 'kept: it serves the runs numbered per run'
    assert 'conversation_id' not in await db['runs'].index_information()
    assert [(s.conversation_id, s.run_count, s.head_run_id) for s in await store.list_conversations()] == [
        ('other', 1, 'new'),
        ('chat', 1, 'old-a'),
    ]
    assert await db['conversations'].count_documents({}) == 2


async def test_a_run_written_before_lines_goes_on_from_its_newest_snapshot(scratch: Scratch) -> None:
    database = await legacy_database(scratch)
    db = scratch.client[database]
    stored_before = await db['messages'].count_documents({})
    store = store_in(scratch, database, media_store=None)
    await store.save_snapshot(ContinuableSnapshot(run_id='old-a', step_index=3, messages=sample_history(3)))

    reader = store_in(scratch, database)
    expected = [dump(sample_history(turns)) for turns in (1, 2, 3)]
    assert await histories(reader, 'old-a') == expected
    added = len(sample_history(3)) - len(sample_history(2))
    assert await db['messages'].count_documents({}) == stored_before + added, 'only the new messages'
    [line] = await db['lines'].find({}).to_list(None)
    assert line['base'] == {'line': 'run:old-a', 'length': len(sample_history(2)), 'through': 5}
    newest = await db['snapshots'].find_one({'run_id': 'old-a', 'seq': 3})
    assert newest['line'] == line['_id'] and newest['through_message'] == added

    await store.save_snapshot(ContinuableSnapshot(run_id='old-a', step_index=4, messages=sample_history(4)))
    assert await histories(store_in(scratch, database), 'old-a') == [*expected, dump(sample_history(4))]
    assert await db['lines'].count_documents({}) == 1, 'the branch goes on as an ordinary line'


async def test_a_new_run_continues_a_snapshot_written_before_lines(scratch: Scratch) -> None:
    database = await legacy_database(scratch)
    db = scratch.client[database]
    store = store_in(scratch, database, media_store=None)
    origin = RunOrigin(kind='continued', run_id='old-a', seq=2)
    await store.register_run(
        RunRecord(run_id='next', conversation_id='chat', origin=origin, started_at=T0 + timedelta(1))
    )
    await store.save_snapshot(ContinuableSnapshot(run_id='next', step_index=1, messages=sample_history(3)))
    assert await db['messages'].count_documents({'run_id': 'next'}) == len(sample_history(3)) - len(sample_history(2))
    assert await histories(store_in(scratch, database), 'next') == [dump(sample_history(3))]

    await store.delete_run(run_id='old-a')
    await store.collect_media(grace=timedelta(0))
    assert await histories(store_in(scratch, database), 'next') == [dump(sample_history(3))]
    assert await db['messages'].count_documents({'run_id': 'old-a'}) == len(sample_history(2)), 'its base stays'

    await store.delete_run(run_id='next')
    assert await db['messages'].count_documents({'run_id': {'$in': ['old-a', 'next']}}) == 0
    assert await db['lines'].count_documents({}) == 0


async def test_collect_media_reclaims_what_no_snapshot_written_before_lines_uses(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    db = scratch.client[database]
    await create_legacy_indexes(db)
    first = sample_history(2)
    completed = [*first[:-1], *sample_history(2, tag='done')[-1:]]  # the newest message completed in place
    await write_legacy_run(db, RUN, [first, completed], registration=1, keep=[2])
    gone = RunRecord(run_id='deleted-halfway')  # a delete interrupted after its runs document went
    await write_legacy_run(db, gone, [sample_history(1)], registration=2)
    await db['runs'].delete_one({'_id': 'deleted-halfway'})
    await db['snapshots'].delete_many({'run_id': 'deleted-halfway'})

    store = store_in(scratch, database)
    collected = await store.collect_media(grace=timedelta(0))
    assert collected.messages == 1 + len(sample_history(1))
    assert await histories(store, 'old-a') == [dump(completed)]
    assert await db['messages'].count_documents({}) == len(completed)
    assert (await store.collect_media(grace=timedelta(0))).messages == 0
