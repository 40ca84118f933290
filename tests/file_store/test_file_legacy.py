"""A store directory written before history lines (`legacy_store/`) still reads, lists and goes on.

`legacy_store/` was written by the file store as it was before lines (see its README): every run
keeps its own `messages.jsonl`, snapshots name no line, `run.json` has no origin, and there is no
conversation index. The store reads all of it back (and lists its conversations without writing), indexes
them at its first write,
continues its runs (a new save starts a line; the old messages are read, never appended to), lets
new runs continue its snapshots, and reclaims and deletes it.
"""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from file_store.file_layout import line_of
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord
from step_persistence.records import RunOrigin, SnapshotRef
from step_persistence.testing.conformance import sample_history

pytestmark = pytest.mark.anyio

LEGACY_STORE = Path(__file__).parent / 'legacy_store'


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    copy = tmp_path / 'store'
    shutil.copytree(LEGACY_STORE, copy, ignore=shutil.ignore_patterns('README.md'))
    return copy


async def assert_histories(store: FileStepStore, run_id: str, expected: list[list[ModelMessage]]) -> None:
    stored = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    assert [dump(snapshot.messages) for snapshot in stored] == [dump(history) for history in expected]


async def test_everything_written_before_lines_reads_back(directory: Path) -> None:
    store = FileStepStore(directory, fsync=False)
    assert [run.run_id for run in await store.list_runs()] == ['old-chat', 'old-retained', 'old-loose']
    chat = await store.get_run(run_id='old-chat')
    assert chat is not None and (chat.conversation_id, chat.agent_name, chat.origin) == ('old-conv', 'librarian', None)
    await assert_histories(store, 'old-chat', [sample_history(step, tag='old-chat') for step in (1, 2, 3)])
    assert [s.state for s in await store.list_snapshots(run_id='old-chat', include_interrupted=True)] == [
        'complete',
        'interrupted',
        'complete',
    ]
    await assert_histories(store, 'old-retained', [sample_history(3, tag='r3')])
    await assert_histories(store, 'old-loose', [sample_history(1, tag='old-loose')])
    assert [event.kind for event in await store.list_events(run_id='old-chat')] == ['run_started']
    assert [effect.status for effect in await store.list_tool_effects(run_id='old-chat')] == ['completed']


def every_file(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob('*') if path.is_file()}


async def assert_conversations_listed(store: FileStepStore) -> None:
    assert [run.run_id for run in await store.list_runs(conversation_id='old-conv', newest_first=True)] == [
        'old-retained',
        'old-chat',
    ]
    [summary] = await store.list_conversations()
    assert (summary.conversation_id, summary.run_count, summary.head_run_id) == ('old-conv', 2, 'old-retained')
    [librarian] = await store.list_conversations(agent_name='librarian')
    assert (librarian.run_count, librarian.head_run_id) == (1, 'old-chat')
    digest = ContinuableSnapshot(run_id='x', step_index=0, messages=sample_history(3, tag='old-chat')).history_digest()
    assert await store.find_snapshot(conversation_id='old-conv', history_digest=digest) == SnapshotRef(
        run_id='old-chat', seq=3
    )


async def test_its_conversations_are_listed_without_writing_and_indexed_by_the_first_write(directory: Path) -> None:
    before = every_file(directory)
    await assert_conversations_listed(FileStepStore(directory, fsync=False))
    assert every_file(directory) == before, 'reading wrote nothing (no index, no marker)'
    store = FileStepStore(directory, fsync=False)
    await store.register_run(RunRecord(run_id='new-loose'))
    assert (directory / '@indexed').exists(), 'the first write indexed every run'
    await assert_conversations_listed(store)
    await assert_conversations_listed(FileStepStore(directory, fsync=False))


async def test_its_runs_go_on_and_new_runs_continue_them(directory: Path) -> None:
    legacy_messages = (directory / 'old-chat' / 'messages.jsonl').read_bytes()
    store = FileStepStore(directory, fsync=False)
    longer = sample_history(4, tag='old-chat')
    await store.save_snapshot(ContinuableSnapshot(run_id='old-chat', step_index=4, messages=longer))
    assert (directory / 'old-chat' / 'messages.jsonl').read_bytes() == legacy_messages, 'never appended to'
    assert line_of(directory, 'old-chat').is_dir()
    history = [sample_history(step, tag='old-chat') for step in (1, 2, 3)]
    await assert_histories(FileStepStore(directory), 'old-chat', [*history, longer])

    origin = RunOrigin(kind='continued', run_id='old-chat', seq=3)
    await store.register_run(RunRecord(run_id='next', conversation_id='old-conv', origin=origin))
    await store.save_snapshot(ContinuableSnapshot(run_id='next', step_index=1, messages=longer))
    await assert_histories(FileStepStore(directory), 'next', [longer])
    assert [run.run_id for run in await store.list_runs(conversation_id='old-conv', limit=1, newest_first=True)] == [
        'next'
    ]


async def test_it_is_reclaimed_and_deleted_like_the_rest(directory: Path) -> None:
    store = FileStepStore(directory, fsync=False)
    retained = directory / 'old-retained' / 'messages.jsonl'
    assert len(retained.read_bytes().splitlines()) == 15
    collected = await store.collect_media(grace=timedelta(0))
    assert collected.messages == 8, 'the rows of the two snapshots retention dropped'
    assert collected.blobs == 0, 'the old messages still refer to the blob'
    assert [json.loads(line)['no'] for line in retained.read_bytes().splitlines()] == list(range(9, 16))
    await assert_histories(FileStepStore(directory), 'old-retained', [sample_history(3, tag='r3')])

    await store.delete_run(run_id='old-chat')
    assert not (directory / 'old-chat').exists()
    assert [run.run_id for run in await store.list_runs(conversation_id='old-conv')] == ['old-retained']
    await assert_histories(store, 'old-loose', [sample_history(1, tag='old-loose')])
