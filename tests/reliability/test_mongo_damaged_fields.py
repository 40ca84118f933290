"""MongoStepStore: one field of one document set to a hostile value (or removed) never hides the rest.

`test_corruption.py` damages a few fields with random values. This goes through every field of every
collection of a run (`runs`, `events`, `snapshots`, `tool_effects`, `messages`), with values the
store never writes: after the damage every listing still works, the healthy records of the run are
all there and unchanged, what was skipped was logged, `get_*` return the record as written or `None`,
nothing altered is returned as true, later writes to the run work and read back (a save after a
damaged message writes that message again), and another run of the database reads back unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from step_persistence import ContinuableSnapshot, MongoStepStore, RunRecord, StepEvent, TokenUsage, ToolEffectRecord
from step_persistence.testing.conformance import sample_history
from support.reliability_helpers import write_sentinel
from support.servers.mongo import MongoServer, Scratch

pytestmark = pytest.mark.anyio

REMOVED = object()
HOSTILE: list[Any] = ['tomorrow', '2026-01-01T00:00:00', -1, 2**62, True, 1.5, [], {'$ne': None}, 'x' * 5000]
"""Values none of the store's fields holds as written, used a few per field (plus `REMOVED`)."""

FIELDS: dict[str, tuple[dict[str, Any], list[str]]] = {
    'runs': (
        {'_id': 'victim'},
        ['conversation_id', 'parent_run_id', 'agent_name', 'metadata', 'started_at', 'started_at_us', 'registration'],
    ),
    'events': (
        {'run_id': 'victim', 'seq': 2},
        [
            'run_id',
            'seq',
            'kind',
            'step_index',
            'timestamp',
            'timestamp_us',
            'conversation_id',
            'parent_run_id',
            'agent_name',
            'tool_call_id',
            'tool_name',
            'error',
            'metadata',
            'idempotency_key',
        ],
    ),
    'snapshots': (
        {'run_id': 'victim', 'seq': 2},
        [
            'run_id',
            'seq',
            'step_index',
            'timestamp',
            'timestamp_us',
            'conversation_id',
            'parent_run_id',
            'agent_name',
            'state',
            'idempotency_key',
            'history_length',
            'through_message',
        ],
    ),
    'tool_effects': (
        {'run_id': 'victim', 'tool_call_id': 'b'},
        [
            'run_id',
            'tool_call_id',
            'tool_name',
            'status',
            'started_at',
            'started_at_us',
            'ended_at',
            'ended_at_us',
            'idempotency_key',
            'effect_summary',
        ],
    ),
    # message 7 is the last of snapshot 3 only; message 5 holds an image (externalized)
    'messages': ({'run_id': 'victim', 'no': 7}, ['run_id', 'no', 'position', 'digest', 'body', 'externalized']),
    'messages@5': ({'run_id': 'victim', 'no': 5}, ['body', 'externalized', 'stored_digest']),
    # listed last, so the fields above keep the hostile values they are tried with
    'events@2': (
        {'run_id': 'victim', 'seq': 2},
        ['model_name', 'usage', 'usage.input_tokens', 'usage.cache_write_tokens'],
    ),
}

USAGE = TokenUsage(input_tokens=10, output_tokens=2, cache_read_tokens=0, cache_write_tokens=0)
"""The usage of the victim's model request (event `seq` 2)."""

NULLABLE = {
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'tool_call_id',
    'tool_name',
    'error',
    'idempotency_key',
    'effect_summary',
    'ended_at',
    'ended_at_us',
    'model_name',
    'usage',
}
"""Fields for which `None` (or no field) is a value the store writes: a record read back may then differ."""

FREE_TEXT = NULLABLE - {'ended_at', 'ended_at_us'}
"""Fields holding any string: a hostile string there is a valid (different) value, read back as such."""


def cases() -> list[Any]:
    found = []
    index = 0
    for collection, (_, names) in FIELDS.items():
        for name in names:
            values = [REMOVED, HOSTILE[index % len(HOSTILE)], HOSTILE[(index + 4) % len(HOSTILE)]]
            index += 1
            for value in values:
                shown = 'removed' if value is REMOVED else repr(value)[:16]
                found.append(pytest.param(collection, name, value, id=f'{collection}.{name}={shown}'))
    return found


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


async def write_victim(store: MongoStepStore) -> None:
    await store.register_run(RunRecord(run_id='victim', conversation_id='c', agent_name='a', metadata={'r': 'v'}))
    for step, kind in enumerate(('run_started', 'model_request_completed', 'run_completed')):
        answered = {'model_name': 'm', 'usage': USAGE} if kind == 'model_request_completed' else {}
        event = StepEvent(run_id='victim', kind=kind, step_index=step, metadata={'n': str(step)}, **answered)
        await store.append_event(event)
    for step in (1, 2, 3):
        state = 'interrupted' if step == 2 else 'complete'
        messages = sample_history(step, tag='victim')
        await store.save_snapshot(ContinuableSnapshot(run_id='victim', step_index=step, messages=messages, state=state))
    for call_id, status in (('a', 'started'), ('b', 'completed')):
        await store.record_tool_effect(
            ToolEffectRecord(run_id='victim', tool_call_id=call_id, tool_name='t', status=status)
        )


_TEMPLATE: dict[str, list[dict[str, Any]]] = {}
"""The documents of a database holding the sentinel and the victim, written once per session."""


@pytest.fixture
async def scratch(mongo_server: MongoServer) -> AsyncIterator[Scratch]:
    async with mongo_server.scratch() as made:
        yield made


async def fresh_copy(scratch: Scratch) -> str:
    """A new database holding the template's documents (written through a store the first time)."""
    if not _TEMPLATE:
        template = scratch.fresh_database()
        async with MongoStepStore(client=scratch.client, database=template) as store:
            await write_sentinel(store)
            await write_victim(store)
        for name in await scratch.client[template].list_collection_names():
            _TEMPLATE[name] = await scratch.client[template][name].find({}).to_list(None)
    database = scratch.fresh_database()
    for name, documents in _TEMPLATE.items():
        await scratch.client[database][name].insert_many(documents)
    return database


async def observe(store: MongoStepStore) -> dict[str, Any]:
    snapshots = await store.list_snapshots(run_id='victim', include_interrupted=True)
    latest = await store.latest_snapshot(run_id='victim', include_interrupted=True)
    return {
        'runs': await store.list_runs(),
        'run': await store.get_run(run_id='victim'),
        'events': await store.list_events(run_id='victim'),
        'effects': await store.list_tool_effects(run_id='victim'),
        'unresolved': await store.list_unresolved_tool_effects(run_id='victim'),
        'a': await store.get_tool_effect(run_id='victim', tool_call_id='a'),
        'b': await store.get_tool_effect(run_id='victim', tool_call_id='b'),
        'snapshots': [(s.seq, s.state, s.step_index, dump(s.messages)) for s in snapshots],
        'snapshot states': await store.list_snapshot_states(run_id='victim'),
        'latest': None if latest is None else (latest.seq, latest.state, latest.step_index, dump(latest.messages)),
    }


async def observe_sentinel(store: MongoStepStore) -> tuple[Any, ...]:
    snapshots = await store.list_snapshots(run_id='sentinel', include_interrupted=True)
    return (
        await store.get_run(run_id='sentinel'),
        await store.list_events(run_id='sentinel'),
        [(s.seq, s.state, dump(s.messages)) for s in snapshots],
        await store.list_tool_effects(run_id='sentinel'),
    )


def survivors(found: list[Any], written: list[Any], *, may_differ: bool, may_move: bool = False) -> list[Any]:
    """`found` checked to be `written` less some records (or, when `may_differ`, with one of them altered),
    in their order (unless `may_move`)."""
    unknown = [item for item in found if item not in written]
    assert len(unknown) <= (1 if may_differ else 0), unknown
    kept = [item for item in found if item in written]
    if not may_move:
        assert kept == [item for item in written if item in kept], 'the order changed'
    return kept


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger='step_persistence')
    return caplog


@pytest.mark.parametrize(('collection', 'name', 'value'), cases())
async def test_one_damaged_field_never_hides_the_rest(
    scratch: Scratch, logged: pytest.LogCaptureFixture, collection: str, name: str, value: Any
) -> None:
    database = await fresh_copy(scratch)
    store = MongoStepStore(client=scratch.client, database=database)
    before = await observe(store)
    sentinel = await observe_sentinel(store)
    selector, _ = FIELDS[collection]
    change = {'$unset': {name: ''}} if value is REMOVED else {'$set': {name: value}}
    result = await scratch.client[database][collection.partition('@')[0]].update_one(selector, change)
    assert result.matched_count == 1
    logged.clear()

    store = MongoStepStore(client=scratch.client, database=database)  # nothing remembered
    after = await observe(store)
    may_differ = (name in NULLABLE and value is REMOVED) or (name in FREE_TEXT and isinstance(value, str))
    assert sentinel[0] in after['runs']
    survivors(after['runs'], before['runs'], may_differ=may_differ)
    assert after['run'] in (before['run'], None) or may_differ
    # An event's seq is its place in the log: another positive integer is a valid (different) place.
    moved = collection == 'events' and name == 'seq' and isinstance(value, int) and not isinstance(value, bool)
    events = survivors(after['events'], before['events'], may_differ=may_differ, may_move=moved)
    assert before['events'][0] in events and before['events'][2] in events
    effects = survivors(after['effects'], before['effects'], may_differ=may_differ)
    assert effects == after['effects'] or may_differ
    assert before['effects'][0] in effects and after['a'] == before['a']
    assert after['b'] in (before['b'], None) or may_differ
    survivors(after['unresolved'], before['unresolved'], may_differ=may_differ)
    snapshots = survivors(after['snapshots'], before['snapshots'], may_differ=False)
    healthy = {'snapshots': [1, 3], 'messages': [1, 2], 'messages@5': [1]}.get(collection, [1, 2, 3])
    assert [entry[0] for entry in snapshots if entry[0] in healthy] == healthy
    assert after['latest'] in before['snapshots'] or after['latest'] is None
    lost = len(after['events']) < 3 or len(after['effects']) < 2 or len(snapshots) < 3 or after['run'] is None
    moved_away = collection in ('events', 'tool_effects', 'snapshots') and name == 'run_id'  # another run's now
    stateless = collection == 'snapshots' and name == 'state' and value is REMOVED  # a pruned one's tombstone
    if lost and not (moved_away or stateless):
        assert logged.records, 'what a listing skipped was logged'

    # the run takes new writes, and reads them back (a damaged message is written again)
    await store.append_event(StepEvent(run_id='victim', kind='run_started', step_index=9))
    await store.record_tool_effect(ToolEffectRecord(run_id='victim', tool_call_id='c', tool_name='t', status='started'))
    messages = sample_history(4, tag='victim')
    await store.save_snapshot(ContinuableSnapshot(run_id='victim', step_index=9, messages=messages))
    reader = MongoStepStore(client=scratch.client, database=database)
    assert 9 in [event.step_index for event in await reader.list_events(run_id='victim')]
    assert await reader.get_tool_effect(run_id='victim', tool_call_id='c') is not None
    latest = await reader.latest_snapshot(run_id='victim')
    assert latest is not None and latest.step_index == 9 and dump(latest.messages) == dump(messages)
    assert await observe_sentinel(reader) == sentinel
