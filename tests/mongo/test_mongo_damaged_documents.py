"""Damaged MongoDB documents (issue 16): one bad document never hides the others, nothing damaged is returned.

Each case writes two runs, damages one field of one document of the first (raw pymongo updates,
values this store never writes: wrong types, missing fields, numbers out of range, a message
edited in place), then reads everything back: every listing works, exactly the damaged record is
missing from it (logged), `get_*` of a damaged document returns `None`, and the other run reads
back unchanged. Stored positions and lengths a run cannot hold allocate nothing.
"""

from __future__ import annotations

import logging
import tracemalloc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from step_persistence import MongoStepStore, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.records import StepWrites
from support.mongo_helpers import scratch, snapshot, store_in
from support.servers.mongo import Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio

UNSET = object()
"""Remove the field instead of setting it."""

RUNS = ('victim', 'other')


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


async def write_runs(store: MongoStepStore) -> None:
    for run_id in RUNS:
        await store.register_run(RunRecord(run_id=run_id, conversation_id='c', agent_name='a', metadata={'k': 'v'}))
        kinds = ('run_started', 'model_request_started', 'run_completed')
        writes = StepWrites(
            tool_effects=[
                ToolEffectRecord(run_id=run_id, tool_call_id=call_id, tool_name='t', status='started')
                for call_id in ('a', 'b', 'c')
            ],
            events=[
                StepEvent(run_id=run_id, kind=kind, step_index=step, metadata={'n': str(step)})
                for step, kind in enumerate(kinds)
            ],
            # messages 1-3, then 4-5, then 6-7 (message 5 holds an image: externalized)
            snapshots=[snapshot(run_id, turns) for turns in (1, 2, 3)],
        )
        await store.write_batch(writes)


async def read_run(store: MongoStepStore, run_id: str) -> dict[str, Any]:
    """Everything the store says about one run, through every read of the protocol."""

    def snapshots(found: list[Any]) -> list[Any]:
        return [(s.seq, s.step_index, s.state, dump(s.messages)) for s in found]

    latest = await store.latest_snapshot(run_id=run_id)
    return {
        'get_run': await store.get_run(run_id=run_id),
        'list_runs': [run for run in await store.list_runs() if run.run_id == run_id],
        'list_runs(conversation_id)': [
            run for run in await store.list_runs(conversation_id='c') if run.run_id == run_id
        ],
        'list_events': await store.list_events(run_id=run_id),
        'list_snapshots': snapshots(await store.list_snapshots(run_id=run_id, include_interrupted=True)),
        'latest_snapshot': snapshots([] if latest is None else [latest]),
        'list_tool_effects': await store.list_tool_effects(run_id=run_id),
        'list_unresolved_tool_effects': await store.list_unresolved_tool_effects(run_id=run_id),
        'get_tool_effect': await store.get_tool_effect(run_id=run_id, tool_call_id='b'),
    }


@dataclass(frozen=True)
class Damage:
    """One field of one document of the victim run set to `value` (or removed)."""

    collection: str
    name: str
    value: Any
    seq: int | None = None
    """Which document: the event or snapshot `seq`, the message `no` (else the run's or call `b`'s)."""
    keeps: tuple[str, ...] = ()
    """The victim's reads that are unchanged although the damaged record would leave them (see `expected`)."""
    logged: bool = True

    def selector(self) -> dict[str, Any]:
        if self.collection == 'runs':
            return {'_id': 'victim'}
        if self.collection == 'tool_effects':
            return {'run_id': 'victim', 'tool_call_id': 'b'}
        number = 'no' if self.collection == 'messages' else 'seq'
        return {'run_id': 'victim', number: self.seq}

    async def apply(self, scratch: Scratch, database: str) -> None:
        collection = scratch.client[database][self.collection]
        if callable(self.value):
            document = await collection.find_one(self.selector())
            change = {'$set': {self.name: self.value(document[self.name])}}
        elif self.value is UNSET:
            change = {'$unset': {self.name: ''}}
        else:
            change = {'$set': {self.name: self.value}}
        result = await collection.update_one(self.selector(), change)
        assert result.modified_count == 1, (self, change)


def expected(damage: Damage, before: dict[str, Any]) -> dict[str, Any]:
    """What the victim's reads show after `damage`: `before` without the damaged record."""
    after = dict(before)
    if damage.collection == 'runs':
        after.update({'get_run': None, 'list_runs': [], 'list_runs(conversation_id)': []})
    elif damage.collection == 'events':
        after['list_events'] = [event for index, event in enumerate(before['list_events']) if index != damage.seq - 1]
    elif damage.collection == 'tool_effects':
        after['get_tool_effect'] = None
        for listing in ('list_tool_effects', 'list_unresolved_tool_effects'):
            after[listing] = [effect for effect in before[listing] if effect.tool_call_id != 'b']
    else:
        # A damaged snapshot is gone; a damaged message takes every snapshot that uses it.
        gone = (
            {damage.seq}
            if damage.collection == 'snapshots'
            else {seq for seq in (1, 2, 3) if damage.seq <= 1 + 2 * seq}
        )
        after['list_snapshots'] = [entry for entry in before['list_snapshots'] if entry[0] not in gone]
        after['latest_snapshot'] = after['list_snapshots'][-1:]
    for name in damage.keeps:
        after[name] = before[name]
    return after


def edit_one_character(body: str) -> str:
    """The same JSON with one character changed, same length (`start` -> `stArt`)."""
    assert 'start' in body
    return body.replace('start', 'stArt', 1)


CASES: list[Damage] = [
    # runs
    Damage('runs', 'started_at', 'yesterday'),
    Damage('runs', 'started_at', UNSET),
    Damage('runs', 'started_at_us', 5.0),
    Damage('runs', 'started_at_us', True),
    Damage('runs', 'started_at_us', 1000),
    Damage('runs', 'metadata', 'k=v'),
    Damage('runs', 'metadata', {'k': 5}),
    Damage('runs', 'metadata', {'k': {'$ne': None}}),
    Damage('runs', 'metadata', {'k%zz': 'v'}),
    Damage('runs', 'agent_name', 5),
    Damage('runs', 'agent_name', {'$ne': None}),
    Damage('runs', 'conversation_id', ['c']),
    Damage('runs', 'parent_run_id', 7),
    Damage('runs', 'origin', 'run-0/1'),
    Damage('runs', 'origin', {'kind': 'continued', 'run_id': 'x'}),
    Damage('runs', 'origin', {'kind': 'sideways', 'run_id': 'x', 'seq': 1}),
    Damage('runs', 'origin', {'kind': 'forked', 'run_id': 'x', 'seq': '1'}),
    # events
    Damage('events', 'kind', 'exploded', seq=2),
    Damage('events', 'kind', UNSET, seq=2),
    Damage('events', 'step_index', '7', seq=2),
    Damage('events', 'step_index', 1.5, seq=2),
    Damage('events', 'step_index', UNSET, seq=2),
    Damage('events', 'seq', '9', seq=2),
    Damage('events', 'seq', 0, seq=2),
    Damage('events', 'seq', UNSET, seq=2),
    Damage('events', 'timestamp', '2026-01-01T00:00:00Z', seq=2),
    Damage('events', 'timestamp_us', -1, seq=2),
    Damage('events', 'metadata', ['n'], seq=2),
    Damage('events', 'metadata', {'n': 1}, seq=2),
    Damage('events', 'error', 5, seq=2),
    Damage('events', 'tool_call_id', {'$ne': None}, seq=2),
    Damage('events', 'idempotency_key', 5, seq=2),
    Damage('events', 'agent_name', True, seq=2),
    # snapshots
    Damage('snapshots', 'state', 'bogus', seq=3),
    Damage('snapshots', 'state', UNSET, seq=3, logged=False),  # no longer matches any query
    Damage('snapshots', 'seq', '3', seq=3),
    Damage('snapshots', 'seq', -3, seq=3),
    Damage('snapshots', 'step_index', '3', seq=3),
    Damage('snapshots', 'history_length', 'seven', seq=3),
    Damage('snapshots', 'history_length', 1_000_000_000, seq=3),
    Damage('snapshots', 'through_message', -1, seq=3),
    Damage('snapshots', 'through_message', 2, seq=3),
    Damage('snapshots', 'line', 'elsewhere', seq=3),
    Damage('snapshots', 'line', None, seq=3),
    Damage('snapshots', 'line', 'f' * 24, seq=3),
    Damage('snapshots', 'line', UNSET, seq=3),
    Damage('snapshots', 'history_digest', 'f' * 64, seq=3),
    Damage('snapshots', 'history_digest', 'F' * 64, seq=3),
    Damage('snapshots', 'history_digest', UNSET, seq=3),
    Damage('snapshots', 'timestamp', 'now', seq=3),
    Damage('snapshots', 'idempotency_key', 5, seq=3),
    Damage('snapshots', 'agent_name', {'$ne': None}, seq=3),
    # tool effects
    Damage('tool_effects', 'status', 'maybe'),
    Damage('tool_effects', 'status', UNSET),
    Damage('tool_effects', 'tool_name', 5),
    Damage('tool_effects', 'tool_name', UNSET),
    Damage('tool_effects', 'started_at', 'x'),
    Damage('tool_effects', 'started_at', UNSET),
    Damage('tool_effects', 'started_at_us', 2.5),
    Damage('tool_effects', 'ended_at', 'later'),
    Damage('tool_effects', 'effect_summary', 5),
    Damage('tool_effects', 'idempotency_key', ['k']),
    # messages (4: a response of the second snapshot, inline; 5: its tool return, with an image)
    Damage('messages', 'body', '{not json', seq=4),
    Damage('messages', 'body', 5, seq=4),
    Damage('messages', 'body', '{}', seq=4),
    Damage('messages', 'digest', 'f' * 64, seq=4),
    Damage('messages', 'digest', UNSET, seq=4),
    Damage('messages', 'externalized', 'yes', seq=4),
    Damage('messages', 'position', 'three', seq=4),
    Damage('messages', 'position', 1_000_000_000, seq=4),
    Damage('messages', 'position', 2.5, seq=4),
    Damage('messages', 'no', 'four', seq=4),
    Damage('messages', 'no', 1_000_000_000, seq=4),
    Damage('messages', 'line', 'f' * 24, seq=4),
    Damage('messages', 'line', UNSET, seq=4),
    Damage('messages', 'body', '[]', seq=5),
    Damage('messages', 'stored_digest', 'f' * 64, seq=5),
    Damage('messages', 'externalized', False, seq=5),
]

EDITS: list[Damage] = [
    Damage('messages', 'body', edit_one_character, seq=1),  # the prompt: every snapshot uses it
]


def case_id(damage: Damage) -> str:
    value = getattr(damage.value, '__name__', None) or ('unset' if damage.value is UNSET else repr(damage.value))
    where = '' if damage.seq is None else f'{damage.seq}'
    return f'{damage.collection}{where}.{damage.name}={value}'[:60]


@dataclass
class Written:
    store: MongoStepStore
    database: str
    before: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])


@pytest.fixture
async def written(scratch: Scratch) -> AsyncIterator[Written]:
    database = scratch.fresh_database()
    async with store_in(scratch, database) as store:
        await write_runs(store)
        yield Written(store, database, {run_id: await read_run(store, run_id) for run_id in RUNS})


async def check(damage: Damage, scratch: Scratch, written: Written, caplog: pytest.LogCaptureFixture) -> None:
    await damage.apply(scratch, written.database)
    fresh = store_in(scratch, written.database)  # nothing remembered from the writes
    with caplog.at_level(logging.WARNING, logger='step_persistence'):
        victim = await read_run(fresh, 'victim')
        other = await read_run(fresh, 'other')
    assert victim == expected(damage, written.before['victim'])
    assert other == written.before['other']
    skipped = [record.getMessage() for record in caplog.records if 'skipping unreadable' in record.getMessage()]
    assert bool(skipped) == damage.logged, skipped


@pytest.mark.parametrize('damage', CASES + EDITS, ids=case_id)
async def test_one_damaged_document_hides_only_itself(
    damage: Damage, scratch: Scratch, written: Written, caplog: pytest.LogCaptureFixture
) -> None:
    await check(damage, scratch, written, caplog)


async def test_a_registration_number_is_only_an_order(
    scratch: Scratch, written: Written, caplog: pytest.LogCaptureFixture
) -> None:
    reads = ('get_run', 'list_runs', 'list_runs(conversation_id)')
    await check(Damage('runs', 'registration', 'first', keeps=reads, logged=False), scratch, written, caplog)


async def test_damaged_counters_refuse_writes_and_leave_reads_alone(scratch: Scratch, written: Written) -> None:
    await scratch.client[written.database]['counters'].update_one({'_id': 'victim'}, {'$set': {'registration': 'x'}})
    fresh = store_in(scratch, written.database)
    with pytest.raises(ValueError, match="counters document of run 'victim' is damaged"):
        await fresh.append_event(StepEvent(run_id='victim', kind='run_completed', step_index=9))
    assert await read_run(fresh, 'victim') == written.before['victim']
    await fresh.append_event(StepEvent(run_id='other', kind='run_completed', step_index=9))
    assert len(await fresh.list_events(run_id='other')) == 4


# --- positions and lengths a run cannot hold ---


async def peak_allocation(call: Callable[[], Any]) -> int:
    """The most memory (in bytes) allocated at once while `call()` is awaited."""
    tracemalloc.start()
    try:
        await call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


MIB = 1024 * 1024


async def test_a_message_claiming_a_huge_position_is_ignored_by_saves_and_reads(
    scratch: Scratch, written: Written
) -> None:
    await Damage('messages', 'position', 1_000_000_000, seq=7).apply(scratch, written.database)
    fresh = store_in(scratch, written.database)  # learns the run's messages from the database

    async def save_and_read() -> None:
        await fresh.save_snapshot(snapshot('victim', 4))
        latest = await fresh.latest_snapshot(run_id='victim')
        assert latest is not None
        assert dump(latest.messages) == dump(snapshot('victim', 4).messages)

    assert await peak_allocation(save_and_read) < 20 * MIB
    assert [entry[0] for entry in (await read_run(fresh, 'victim'))['list_snapshots']] == [1, 2, 4]


@pytest.mark.parametrize('length', [3_000_000, 1_000_000_000], ids=['millions', 'a billion'])
async def test_a_snapshot_claiming_a_huge_history_is_skipped_without_allocating(
    scratch: Scratch, written: Written, length: int
) -> None:
    changes = {'history_length': length, 'through_message': 2 * length}
    await scratch.client[written.database]['snapshots'].update_one({'run_id': 'victim', 'seq': 3}, {'$set': changes})
    fresh = store_in(scratch, written.database)

    async def read() -> None:
        latest = await fresh.latest_snapshot(run_id='victim')
        assert latest is not None and latest.seq == 2
        assert [found.seq for found in await fresh.list_snapshots(run_id='victim')] == [1, 2]

    assert await peak_allocation(read) < 20 * MIB


async def test_collect_media_goes_past_damaged_documents(scratch: Scratch, written: Written) -> None:
    db = scratch.client[written.database]
    await db['messages'].update_one({'run_id': 'victim', 'no': 7}, {'$set': {'run_id': {'$ne': None}}})
    await db['messages'].update_one({'run_id': 'victim', 'no': 6}, {'$set': {'position': True}})
    await db['messages'].insert_one({'_id': 'not an ObjectId', 'run_id': 'gone', 'no': 1, 'position': 0})
    await db['runs'].insert_one({'_id': {'not': 'a run id'}})
    await db['snapshots'].update_one({'run_id': 'victim', 'seq': 2}, {'$set': {'through_message': 'five'}})
    fresh = store_in(scratch, written.database)
    await fresh.collect_media(grace=timedelta(0))
    assert await read_run(fresh, 'other') == written.before['other']
    assert [entry[0] for entry in (await read_run(fresh, 'victim'))['list_snapshots']] == [1]
    assert await db['messages'].count_documents({'_id': 'not an ObjectId'}) == 1  # its age is unknown: kept


@pytest.mark.parametrize('seq', [2.5, '2', [0.5, 2.5], True], ids=repr)
async def test_latest_snapshot_pages_past_a_damaged_seq(scratch: Scratch, seq: Any) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database)
    await store.register_run(RunRecord(run_id='deep'))
    for turns in range(1, 7):
        await store.save_snapshot(snapshot('deep', turns))
    snapshots = scratch.client[database]['snapshots']
    await snapshots.update_many({'seq': {'$gte': 4}}, {'$set': {'history_length': 'unreadable'}})
    await snapshots.update_one({'seq': 3}, {'$set': {'seq': seq}})
    latest = await store_in(scratch, database).latest_snapshot(run_id='deep')
    assert latest is not None and latest.seq == 2
