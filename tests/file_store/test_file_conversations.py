"""The file store's conversations: one line per chat, and listings that read only what they return.

Reads are counted by the store itself (`io_counters.files_read`: each file opened to read, lock
files included; `directories_listed`), so "bounded" means: the same count among 30 conversations
as among 300, or in a conversation of 30 runs as in one of 300.
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from file_store.file_layout import line_of, stored_message_lines
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord
from step_persistence.records import RunOrigin, SnapshotRef
from step_persistence.stores._listing import ConversationFilter, conversation_summaries
from step_persistence.stores.file._layout import start_of
from step_persistence.testing.conformance.conversations import chat_history
from support.chat import chat_agent, chat_turns

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def names_below(root: Path) -> list[str]:
    """Every path below `root` but the store's staging directory."""
    return sorted(str(path.relative_to(root)) for path in root.rglob('*') if '@tmp' not in path.parts)


async def test_a_forty_turn_chat_stores_each_message_once(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    history = await chat_turns(chat_agent(store), 40)
    assert len(history) == 160
    assert stored_message_lines(tmp_path) == 160, 'each message once, in one line'
    assert len(os.listdir(tmp_path / '@lines')) == 1
    runs = await store.list_runs()
    assert len(runs) == 40 and all(run.origin is not None and run.origin.kind == 'continued' for run in runs[1:])
    latest = await store.latest_snapshot(run_id=runs[-1].run_id)
    assert latest is not None and dump(latest.messages) == dump(history)


async def test_each_turn_after_the_first_reads_no_message(tmp_path: Path) -> None:
    """A chat's next turn builds on its origin's line from the history's own digests."""
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='turn-0', conversation_id='c'))
    await store.save_snapshot(ContinuableSnapshot(run_id='turn-0', step_index=1, messages=chat_history(1)))
    reads = []
    for turn in range(1, 6):
        run_id = f'turn-{turn}'
        origin = RunOrigin(kind='continued', run_id=f'turn-{turn - 1}', seq=1)
        await store.register_run(RunRecord(run_id=run_id, conversation_id='c', origin=origin))
        before = store.io_counters.bytes_read
        await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, messages=chat_history(turn + 1)))
        reads.append(store.io_counters.bytes_read - before)
    assert max(reads) - min(reads) < 64, reads  # numbers gain digits; nothing grows with the history
    assert stored_message_lines(tmp_path) == 12


async def _conversations(store: FileStepStore, count: int, *, runs_each: int = 1) -> list[tuple[RunRecord, int]]:
    registered = []
    for number in range(count):
        for run in range(runs_each):
            record = RunRecord(
                run_id=f'c{number}-r{run}',
                conversation_id=f'conversation {number} ✓',
                agent_name='writer' if number % 3 else 'reader',
                started_at=T0 + timedelta(minutes=(number * 7919) % count, seconds=run),
            )
            await store.register_run(record)
            registered.append((record, len(registered)))
    return registered


def _counts(store: FileStepStore) -> tuple[int, int]:
    return store.io_counters.files_read, store.io_counters.directories_listed


async def _cost(store: FileStepStore, call: Any) -> tuple[Any, tuple[int, int]]:
    before = _counts(store)
    result = await call()
    after = _counts(store)
    return result, (after[0] - before[0], after[1] - before[1])


async def test_list_conversations_reads_only_the_summaries_it_returns(tmp_path: Path) -> None:
    costs = []
    for count in (30, 300):
        store = FileStepStore(tmp_path / str(count), fsync=False)
        registered = await _conversations(store, count)
        await store.list_conversations(limit=1)  # the index exists: not the cost measured
        for options in ({}, {'newest_first': False}, {'agent_name': 'writer'}):
            found, cost = await _cost(store, partial(store.list_conversations, limit=20, **options))
            reference = conversation_summaries(registered, ConversationFilter(limit=20, **options))
            assert found == reference
            costs.append((options, cost))
        assert all(cost[0] <= 20 and cost[1] <= 21 for _, cost in costs), costs
    assert costs[:3] == costs[3:], 'the same reads among 30 conversations as among 300'


async def test_a_conversations_newest_runs_read_only_those(tmp_path: Path) -> None:
    costs = []
    for runs in (30, 300):
        store = FileStepStore(tmp_path / str(runs), fsync=False)
        await _conversations(store, 1, runs_each=runs)
        newest = partial(store.list_runs, conversation_id='conversation 0 ✓', limit=20, newest_first=True)
        found, cost = await _cost(store, newest)
        assert [run.run_id for run in found] == [f'c0-r{run}' for run in range(runs - 1, runs - 21, -1)]
        costs.append(cost)
    assert costs[0] == costs[1] == (20, 1), costs


async def test_find_snapshot_in_a_chat_reads_the_newest_run_only(tmp_path: Path) -> None:
    costs = []
    for turns in (5, 25):
        store = FileStepStore(tmp_path / str(turns), fsync=False)
        for turn in range(turns):
            origin = None if turn == 0 else RunOrigin(kind='continued', run_id=f'turn-{turn - 1}', seq=1)
            record = RunRecord(run_id=f'turn-{turn}', conversation_id='chat', origin=origin)
            await store.register_run(record)
            await store.save_snapshot(
                ContinuableSnapshot(run_id=record.run_id, step_index=1, messages=chat_history(turn + 1))
            )
        reader = FileStepStore(tmp_path / str(turns), fsync=False)
        digest = ContinuableSnapshot(run_id='x', step_index=0, messages=chat_history(turns)).history_digest()
        found, cost = await _cost(reader, partial(reader.find_snapshot, conversation_id='chat', history_digest=digest))
        assert found == SnapshotRef(run_id=f'turn-{turns - 1}', seq=1)
        costs.append(cost)
    assert costs[0] == costs[1], costs


async def test_conversation_ids_and_agent_names_never_become_paths(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'store', fsync=False)
    hostile = ['../../outside', '/etc/passwd', 'a/b\\c', '\x00nul', '.', '..', 'x' * 70_000, '@media']
    for number, text in enumerate(hostile):
        await store.register_run(RunRecord(run_id=f'r{number}', conversation_id=text, agent_name=text))
    assert sorted(os.listdir(tmp_path)) == ['store']
    for number, text in enumerate(hostile):
        assert [run.run_id for run in await store.list_runs(conversation_id=text, agent_name=text)] == [f'r{number}']
    summaries = await store.list_conversations(newest_first=False)
    assert [summary.conversation_id for summary in summaries] == hostile
    names = {path.name for path in (tmp_path / 'store').rglob('*')}
    assert not any(text in names for text in hostile if text not in {'.', '..'})


async def test_entries_left_by_a_crash_never_count_and_stale_markers_are_repaired(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    for minute in range(3):
        await store.register_run(
            RunRecord(run_id=f'r{minute}', conversation_id='c', started_at=T0 + timedelta(minutes=minute))
        )
    await store.register_run(RunRecord(run_id='other', conversation_id='d', started_at=T0 + timedelta(minutes=1)))
    conversation = next(path for path in (tmp_path / '@conversations').iterdir() if len(os.listdir(path / 'runs')) == 3)
    # A registration that crashed after indexing, before its directory appeared: a phantom entry and
    # a marker raised for it.
    staged = tmp_path / 'staged-run.json'
    staged.write_text('{}')
    phantom = start_of(T0 + timedelta(hours=1))
    os.link(staged, conversation / 'runs' / f'{phantom:019d}.{1:020d}.ghost')
    markers = tmp_path / '@latest' / 'all'
    [marker] = [name for name in os.listdir(markers) if name.endswith(conversation.name)]
    os.rename(markers / marker, markers / f'{phantom:019d}.{conversation.name}')

    summaries = await store.list_conversations()
    assert [(s.conversation_id, s.run_count, s.head_run_id) for s in summaries] == [('c', 3, 'r2'), ('d', 1, 'other')]
    repaired = [name for name in os.listdir(markers) if name.endswith(conversation.name)]
    assert repaired == [f'{start_of(T0 + timedelta(minutes=2)):019d}.{conversation.name}'], (
        'where its newest run starts'
    )
    assert [run.run_id for run in await store.list_runs(conversation_id='c')] == ['r0', 'r1', 'r2']


async def test_deleting_runs_takes_them_out_of_their_conversation(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    for minute in range(3):
        await store.register_run(
            RunRecord(
                run_id=f'r{minute}', conversation_id='c', agent_name='a', started_at=T0 + timedelta(minutes=minute)
            )
        )
    await store.delete_run(run_id='r2')
    [summary] = await store.list_conversations()
    assert (summary.run_count, summary.head_run_id, summary.last_started_at) == (2, 'r1', T0 + timedelta(minutes=1))
    [mine] = await store.list_conversations(agent_name='a')
    assert mine == summary
    for run_id in ('r0', 'r1'):
        await store.delete_run(run_id=run_id)
    assert await store.list_conversations() == []
    assert await store.list_conversations(agent_name='a') == []
    assert os.listdir(tmp_path / '@latest' / 'all') == []
    await store.register_run(RunRecord(run_id='r0', conversation_id='c', started_at=T0))
    assert [(s.run_count, s.head_run_id) for s in await store.list_conversations()] == [(1, 'r0')]


async def test_a_duplicate_registration_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='r', conversation_id='c', started_at=T0))
    before = names_below(tmp_path)
    with pytest.raises(ValueError, match='already registered'):
        await store.register_run(RunRecord(run_id='r', conversation_id='c', started_at=T0 + timedelta(days=1)))
    assert names_below(tmp_path) == before
    [summary] = await store.list_conversations()
    assert (summary.run_count, summary.last_started_at) == (1, T0)


async def test_deleting_a_chat_removes_its_lines_with_its_last_run(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    for turn in range(4):
        origin = None if turn == 0 else RunOrigin(kind='continued', run_id=f'turn-{turn - 1}', seq=1)
        await store.register_run(RunRecord(run_id=f'turn-{turn}', conversation_id='chat', origin=origin))
        await store.save_snapshot(
            ContinuableSnapshot(run_id=f'turn-{turn}', step_index=1, messages=chat_history(turn + 1))
        )
    fork = chat_history(2) + chat_history(1, tag='-fork', start=2)
    await store.register_run(RunRecord(run_id='fork', origin=RunOrigin(kind='forked', run_id='turn-1', seq=1)))
    await store.save_snapshot(ContinuableSnapshot(run_id='fork', step_index=1, messages=fork))
    chat_line, fork_line = line_of(tmp_path, 'turn-3'), line_of(tmp_path, 'fork')
    assert chat_line != fork_line and sorted(os.listdir(tmp_path / '@lines')) == sorted(
        [chat_line.name, fork_line.name]
    )
    for turn in range(4):
        await store.delete_run(run_id=f'turn-{turn}')
    assert sorted(os.listdir(tmp_path / '@lines')) == sorted([chat_line.name, fork_line.name]), 'the base stays'
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='fork')
    assert latest is not None and dump(latest.messages) == dump(fork)
    await store.delete_run(run_id='fork')
    assert os.listdir(tmp_path / '@lines') == [], 'the fork went, then the line it branched from'


async def test_a_copy_made_without_hard_links_keeps_its_conversations(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'store', fsync=False)
    for minute in range(3):
        await store.register_run(
            RunRecord(
                run_id=f'r{minute}', conversation_id='c', agent_name='a', started_at=T0 + timedelta(minutes=minute)
            )
        )
    await store.delete_run(run_id='r1')
    await store.register_run(RunRecord(run_id='r1', conversation_id='elsewhere', started_at=T0))
    await anyio.to_thread.run_sync(shutil.copytree, tmp_path / 'store', tmp_path / 'copy')  # hard links become files
    copy = FileStepStore(tmp_path / 'copy', fsync=False)
    assert [run.run_id for run in await copy.list_runs(conversation_id='c')] == ['r0', 'r2']
    assert [(s.conversation_id, s.run_count, s.head_run_id) for s in await copy.list_conversations()] == [
        ('c', 2, 'r2'),
        ('elsewhere', 1, 'r1'),
    ]
    assert [(s.run_count, s.head_run_id) for s in await copy.list_conversations(agent_name='a')] == [(2, 'r2')]
