"""History lines on MongoDB: a chat on one line, branches, claimed numbers, and what reclaiming leaves.

The documents are looked at directly: which line each message is on, the `lines` documents of
branches, tombstones of reclaimed versions. Every history is also read back through a fresh store
(nothing remembered) to check that it is exactly what was saved.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart

from step_persistence import ContinuableSnapshot, MongoStepStore, RunRecord
from step_persistence.records import RunOrigin, SnapshotState
from support.chat import chat_agent, chat_turns
from support.mongo_helpers import CommandLog, scratch, store_in
from support.servers.mongo import MongoServer, Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def said(*contents: str) -> list[ModelMessage]:
    """One model response per content: small distinct messages."""
    return [ModelResponse(parts=[TextPart(content)], timestamp=T0) for content in contents]


def snap(
    run_id: str, step: int, messages: list[ModelMessage], state: SnapshotState = 'complete'
) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages, state=state)


async def reads(scratch: Scratch, database: str, run_id: str) -> list[bytes]:
    """The run's snapshots as a fresh store reads them."""
    found = await store_in(scratch, database).list_snapshots(run_id=run_id, include_interrupted=True)
    return [dump(snapshot.messages) for snapshot in found]


async def rows(scratch: Scratch, database: str, **query: Any) -> list[tuple[Any, ...]]:
    """`(no, position, has a body)` of the message documents matching `query`, by number."""
    found = scratch.client[database]['messages'].find(query).sort('no', 1)
    return [(document['no'], document.get('position'), 'body' in document) async for document in found]


def origin(run_id: str, seq: int, kind: str = 'continued') -> RunOrigin:
    return RunOrigin.model_validate({'kind': kind, 'run_id': run_id, 'seq': seq})


async def test_a_40_turn_chat_stores_each_message_once_on_one_line_at_a_constant_cost(
    mongo_server: MongoServer, scratch: Scratch
) -> None:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    database = scratch.fresh_database()
    try:
        agent = chat_agent(MongoStepStore(client=client, database=database, media_store=None))
        history: list[ModelMessage] = []
        commands: list[int] = []
        for _ in range(40):
            before = len(log.commands)
            history = await chat_turns(agent, 1, history)
            commands.append(len(log.commands) - before)
    finally:
        await client.close()
    db = scratch.client[database]
    assert len(history) == 4 * 40
    assert await db['messages'].count_documents({}) == len(history), 'each message stored once'
    assert len(await db['messages'].distinct('line')) == 1 and await db['lines'].count_documents({}) == 0
    on_messages = {name for name, collection in log.per_collection() if collection == 'messages'}
    assert 'insert' in on_messages and not on_messages & {'find', 'aggregate'}, 'no turn reads stored messages'
    assert commands[39] == commands[4], f'commands per turn: {commands}'


async def test_a_second_continuation_of_one_snapshot_branches_and_shares_the_history_before_it(
    scratch: Scratch,
) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database, media_store=None)
    base = said('q0', 'a0')
    await store.register_run(RunRecord(run_id='head', conversation_id='c'))
    await store.save_snapshot(snap('head', 1, base))
    for tab in ('tab-1', 'tab-2'):
        await store.register_run(RunRecord(run_id=tab, conversation_id='c', origin=origin('head', 1)))
        await store.save_snapshot(snap(tab, 1, [*base, *said(f'{tab} q', f'{tab} a')]))
    db = scratch.client[database]
    assert (await store.get_run(run_id='tab-2')).origin == origin('head', 1, 'forked')  # type: ignore[union-attr]
    head_line = (await db['snapshots'].find_one({'run_id': 'head'}))['line']
    assert (await db['snapshots'].find_one({'run_id': 'tab-1'}))['line'] == head_line, 'the continuation appends'
    [branch] = await db['lines'].find({}).to_list(None)
    assert branch['base'] == {'line': head_line, 'length': 2, 'through': 2}
    assert await rows(scratch, database, line=head_line) == [(1, 0, True), (2, 1, True), (3, 2, True), (4, 3, True)]
    assert await rows(scratch, database, line=branch['_id']) == [(1, 2, True), (2, 3, True)]
    for tab in ('tab-1', 'tab-2'):
        assert await reads(scratch, database, tab) == [dump([*base, *said(f'{tab} q', f'{tab} a')])]


async def test_a_writer_behind_another_writer_of_the_same_run_branches(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    first, second = store_in(scratch, database, media_store=None), store_in(scratch, database, media_store=None)
    await first.register_run(RunRecord(run_id='run'))
    saved = [said('a'), said('a', 'b'), said('a', 'c')]
    await first.save_snapshot(snap('run', 1, saved[0]))
    await second.save_snapshot(snap('run', 2, saved[1]))  # appends number 2 on the line
    await first.save_snapshot(snap('run', 3, saved[2]))  # its head ends at 1: number 2 is taken
    assert await reads(scratch, database, 'run') == [dump(history) for history in saved]
    assert await scratch.client[database]['lines'].count_documents({}) == 1


async def test_a_reclaimed_version_keeps_its_number_so_a_fork_never_writes_under_a_later_view(
    scratch: Scratch,
) -> None:
    """The fork's head ends at number 2, and number 3 was reclaimed while 4 and 5 are still used:
    were 3 free again, the fork's rewritten position 1 would become part of the later view."""
    database = scratch.fresh_database()
    store = store_in(scratch, database, media_store=None, max_snapshots_per_run=1)
    await store.register_run(RunRecord(run_id='main'))
    kept_first, pruned, kept_last = said('p', 'a'), said('p', 'a', 'x'), said('p', 'a', 'y', 'z')
    await store.save_snapshot(snap('main', 1, kept_first))  # numbers 1, 2
    await store.save_snapshot(snap('main', 2, pruned, 'interrupted'))  # 3 (position 2)
    await store.save_snapshot(snap('main', 3, kept_last, 'interrupted'))  # 4, 5; the newest complete stays
    assert (await store.collect_media(grace=timedelta(0))).messages == 1
    line = (await scratch.client[database]['snapshots'].find_one({'run_id': 'main', 'seq': 1}))['line']
    assert await rows(scratch, database, line=line) == [
        (1, 0, True),
        (2, 1, True),
        (3, None, False),
        (4, 2, True),
        (5, 3, True),
    ]

    await store.register_run(RunRecord(run_id='fork', origin=origin('main', 1, 'forked')))
    fork = said('p', 'edited', 'w')
    await store.save_snapshot(snap('fork', 1, fork))
    assert await reads(scratch, database, 'main') == [dump(kept_first), dump(kept_last)]
    assert await reads(scratch, database, 'fork') == [dump(fork)]
    assert await scratch.client[database]['lines'].count_documents({}) == 1, 'the fork branched'


async def test_deleting_a_run_reclaims_what_only_it_used_but_not_what_a_save_in_flight_added(
    scratch: Scratch,
) -> None:
    database = scratch.fresh_database()
    db = scratch.client[database]
    store = store_in(scratch, database, media_store=None)
    await store.register_run(RunRecord(run_id='first'))
    await store.save_snapshot(snap('first', 1, said('q', 'a')))  # numbers 1, 2
    await store.register_run(RunRecord(run_id='second', origin=origin('first', 1)))
    await store.save_snapshot(snap('second', 1, said('q', 'a', 'q2', 'a2')))  # 3, 4
    line = (await db['snapshots'].find_one({'run_id': 'first'}))['line']
    in_flight = await db['messages'].find_one({'line': line, 'no': 4}, {'_id': 0})
    await db['messages'].insert_one({**in_flight, 'no': 5, 'run_id': 'third'})  # a third run's save, not done

    await store.delete_run(run_id='second')
    assert await rows(scratch, database, line=line) == [
        (1, 0, True),
        (2, 1, True),
        (3, None, False),
        (4, None, False),
        (5, 3, True),
    ]
    assert await reads(scratch, database, 'first') == [dump(said('q', 'a'))]

    await store.delete_run(run_id='first')
    assert await db['messages'].count_documents({}) == 0, 'a line without views goes whole'


async def test_deleting_the_last_run_on_a_branch_goes_down_to_its_base(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    db = scratch.client[database]
    store = store_in(scratch, database, media_store=None)
    await store.register_run(RunRecord(run_id='head'))
    await store.save_snapshot(snap('head', 1, said('q', 'a')))
    for tab in ('tab-1', 'tab-2'):
        await store.register_run(RunRecord(run_id=tab, origin=origin('head', 1)))
        await store.save_snapshot(snap(tab, 1, said('q', 'a', tab)))
    await store.delete_run(run_id='head')
    await store.delete_run(run_id='tab-1')
    assert await reads(scratch, database, 'tab-2') == [dump(said('q', 'a', 'tab-2'))]
    await store.delete_run(run_id='tab-2')
    assert await db['messages'].count_documents({}) == 0
    assert await db['lines'].count_documents({}) == 0


async def test_collect_media_removes_a_line_no_snapshot_names_once_older_than_grace(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    db = scratch.client[database]
    store = store_in(scratch, database, media_store=None)
    await store.register_run(RunRecord(run_id='run'))
    await store.save_snapshot(snap('run', 1, said('kept')))
    kept = await db['messages'].find_one({}, {'_id': 0})
    await db['messages'].insert_one({**kept, 'line': 'a' * 24, 'run_id': 'crashed'})  # a save that never finished
    assert (await store.collect_media(grace=timedelta(hours=1))).messages == 0
    assert (await store.collect_media(grace=timedelta(0))).messages == 1
    assert await db['messages'].distinct('line') == [kept['line']]
    assert await reads(scratch, database, 'run') == [dump(said('kept'))]


async def test_a_history_that_does_not_match_its_digest_is_not_returned(
    scratch: Scratch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two intact message documents swapped (each body still matches its digest): the assembled
    history differs from the one saved, and its `history_digest` says so."""
    database = scratch.fresh_database()
    db = scratch.client[database]
    store = store_in(scratch, database, media_store=None)
    await store.register_run(RunRecord(run_id='run'))
    await store.save_snapshot(snap('run', 1, said('one', 'two')))
    await store.save_snapshot(snap('run', 2, said('one', 'two', 'three')))
    await db['messages'].update_one({'no': 1}, {'$set': {'position': 1}})
    await db['messages'].update_one({'no': 2}, {'$set': {'position': 0}})
    with caplog.at_level(logging.WARNING, logger='step_persistence'):
        assert await reads(scratch, database, 'run') == []
    assert 'do not make up the history the snapshot recorded' in caplog.text
    await store_in(scratch, database).save_snapshot(snap('run', 3, said('one', 'two', 'three', 'four')))
    assert await reads(scratch, database, 'run') == [dump(said('one', 'two', 'three', 'four'))]


async def test_a_damaged_line_base_hides_only_the_branch(scratch: Scratch, caplog: pytest.LogCaptureFixture) -> None:
    database = scratch.fresh_database()
    db = scratch.client[database]
    store = store_in(scratch, database, media_store=None)
    await store.register_run(RunRecord(run_id='head'))
    await store.save_snapshot(snap('head', 1, said('q')))
    for tab in ('tab-1', 'tab-2'):
        await store.register_run(RunRecord(run_id=tab, origin=origin('head', 1)))
        await store.save_snapshot(snap(tab, 1, said('q', tab)))
    await db['lines'].update_one({}, {'$set': {'base.length': 'one'}})
    with caplog.at_level(logging.WARNING, logger='step_persistence'):
        assert await reads(scratch, database, 'tab-2') == []
    assert 'line base length' in caplog.text
    assert await reads(scratch, database, 'tab-1') == [dump(said('q', 'tab-1'))]
    assert await reads(scratch, database, 'head') == [dump(said('q'))]


async def test_a_replayed_snapshot_leaves_no_head_on_versions_no_snapshot_names(scratch: Scratch) -> None:
    """Replaying an earlier save (its idempotency key already stored) writes its changed versions but
    no snapshot: the next save must not build on them once they are collected."""
    database = scratch.fresh_database()
    store = store_in(scratch, database, media_store=None)
    await store.register_run(RunRecord(run_id='run'))
    first, second = said('a', 'b'), said('a', 'b completed', 'c')
    await store.save_snapshot(snap('run', 1, first).model_copy(update={'idempotency_key': 'one'}))
    await store.save_snapshot(snap('run', 2, second).model_copy(update={'idempotency_key': 'two'}))
    await store.save_snapshot(snap('run', 1, first).model_copy(update={'idempotency_key': 'one'}))  # a replay
    assert (await store.collect_media(grace=timedelta(0))).messages == 1, "the replay's version of 'b'"
    third = said('a', 'b', 'd')
    await store.save_snapshot(snap('run', 3, third))
    assert await reads(scratch, database, 'run') == [dump(first), dump(second), dump(third)]


async def test_deleting_a_chat_newest_first_judges_only_each_turns_own_versions(
    mongo_server: MongoServer, scratch: Scratch
) -> None:
    database = scratch.fresh_database()
    store = store_in(scratch, database, media_store=None)
    throughs = []
    for turn in range(5):
        previous = None if turn == 0 else origin(f'turn-{turn - 1}', 1)
        await store.register_run(RunRecord(run_id=f'turn-{turn}', conversation_id='c', origin=previous))
        await store.save_snapshot(snap(f'turn-{turn}', 1, said(*[f'message {n}' for n in range(2 * turn + 2)])))
        throughs.append(2 * turn + 2)
    log = CommandLog()
    client = log.client(mongo_server.uri)
    try:
        deleting = MongoStepStore(client=client, database=database, media_store=None)
        for turn in reversed(range(1, 5)):
            log.commands.clear()
            await deleting.delete_run(run_id=f'turn-{turn}')
            [read] = [
                command['filter']
                for name, collection, command in log.commands
                if (name, collection) == ('find', 'messages')
            ]
            assert read['no'] == {'$gt': throughs[turn - 1], '$lt': throughs[turn] + 1}
            assert await reads(scratch, database, f'turn-{turn - 1}') == [
                dump(said(*[f'message {n}' for n in range(2 * turn)]))
            ]
    finally:
        await client.close()
    assert await scratch.client[database]['messages'].count_documents({'reclaimed': {'$exists': False}}) == 2
