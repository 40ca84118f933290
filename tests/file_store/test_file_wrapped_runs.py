"""A store directory written when `run.json` wrapped its record (`wrapped_store/`) reads and goes on in place.

Since issue 19 `run.json` is the `RunRecord` itself and the registration stamp is in
`registration.json`; `wrapped_store/` was written before (see its README): each `run.json` is
`{"run": ..., "registered_ns": ...}`, and the conversation index's entries are plain copies (a
checkout has no hard links). The store reads all of it without writing anything, writes to its
runs in place without rewriting their `run.json`, and registers new runs beside them in the new
spelling.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.records import RunOrigin, SnapshotRef
from step_persistence.testing.conformance import sample_history

pytestmark = pytest.mark.anyio

WRAPPED_STORE = Path(__file__).parent / 'wrapped_store'
RUNS = ['turn-1', 'turn-2', 'fork', 'loose']


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    copy = tmp_path / 'store'
    shutil.copytree(WRAPPED_STORE, copy, ignore=shutil.ignore_patterns('README.md'))
    return copy


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (`None` for a directory)."""
    return {path.relative_to(root).as_posix(): None if path.is_dir() else path.read_bytes() for path in root.rglob('*')}


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def forked_history() -> list[ModelMessage]:
    return [*sample_history(1, tag='chat'), *sample_history(1, tag='fork')[1:]]


async def test_everything_reads_back_and_reading_writes_nothing(directory: Path) -> None:
    before = tree(directory)
    store = FileStepStore(directory, fsync=False)

    assert [run.run_id for run in await store.list_runs()] == ['turn-1', 'loose', 'turn-2', 'fork']
    turn_1, turn_2, fork, loose = [await store.get_run(run_id=run_id) for run_id in RUNS]
    assert turn_1 is not None and (turn_1.conversation_id, turn_1.agent_name, dict(turn_1.metadata)) == (
        'chat',
        'librarian',
        {'n': '1'},
    )
    assert turn_2 is not None and turn_2.origin == RunOrigin(kind='continued', run_id='turn-1', seq=3)
    assert fork is not None and fork.origin == RunOrigin(kind='forked', run_id='turn-1', seq=1)
    assert loose is not None and loose.parent_run_id == 'turn-1'
    assert [run.run_id for run in await store.list_runs(conversation_id='chat', newest_first=True)] == [
        'turn-2',
        'turn-1',
    ]
    assert [run.run_id for run in await store.list_runs(parent_run_id='turn-1')] == ['loose']
    summaries = await store.list_conversations()
    assert [(s.conversation_id, s.run_count, s.head_run_id) for s in summaries] == [
        ('other', 1, 'fork'),
        ('chat', 2, 'turn-2'),
    ]

    assert [event.kind for event in await store.list_events(run_id='turn-1')] == ['run_started', 'run_completed']
    [unresolved] = await store.list_unresolved_tool_effects(run_id='turn-1')
    assert (unresolved.tool_call_id, unresolved.idempotency_key, unresolved.effect_summary) == (
        'call-open',
        'charge-1',
        'charge card',
    )
    snapshots = await store.list_snapshots(run_id='turn-1', include_interrupted=True)
    assert [(s.seq, s.state) for s in snapshots] == [(1, 'complete'), (2, 'interrupted'), (3, 'complete')]
    assert [dump(s.messages) for s in snapshots] == [dump(sample_history(step, tag='chat')) for step in (1, 2, 3)]
    latest = await store.latest_snapshot(run_id='turn-2')
    assert latest is not None and dump(latest.messages) == dump(sample_history(4, tag='chat'))
    forked = await store.latest_snapshot(run_id='fork')
    assert forked is not None and dump(forked.messages) == dump(forked_history())
    digest = snapshots[-1].history_digest()
    assert await store.find_snapshot(conversation_id='chat', history_digest=digest) == SnapshotRef(
        run_id='turn-1', seq=3
    )

    assert tree(directory) == before, 'reading wrote nothing'


async def test_its_runs_are_written_to_in_place_and_new_runs_use_the_new_spelling(directory: Path) -> None:
    wrapped = {run_id: (directory / run_id / 'run.json').read_bytes() for run_id in RUNS}
    store = FileStepStore(directory, fsync=False)
    await store.append_event(StepEvent(run_id='turn-2', kind='run_completed', step_index=2))
    await store.record_tool_effect(ToolEffectRecord(run_id='turn-2', tool_call_id='c', tool_name='t', status='started'))
    await store.save_snapshot(
        ContinuableSnapshot(run_id='turn-2', step_index=2, messages=sample_history(5, tag='chat'))
    )
    origin = RunOrigin(kind='continued', run_id='turn-2', seq=2)
    record = RunRecord(run_id='turn-3', conversation_id='chat', agent_name='librarian', origin=origin)
    await store.register_run(record)
    await store.save_snapshot(
        ContinuableSnapshot(run_id='turn-3', step_index=1, messages=sample_history(6, tag='chat'))
    )

    assert {run_id: (directory / run_id / 'run.json').read_bytes() for run_id in RUNS} == wrapped
    assert not (directory / 'turn-2' / 'registration.json').exists(), 'an old run keeps its spelling'
    assert RunRecord.model_validate_json((directory / 'turn-3' / 'run.json').read_bytes()) == record
    assert isinstance(json.loads((directory / 'turn-3' / 'registration.json').read_bytes())['registered_ns'], int)

    reader = FileStepStore(directory, fsync=False)
    assert [run.run_id for run in await reader.list_runs(conversation_id='chat')] == ['turn-1', 'turn-2', 'turn-3']
    assert [run.run_id for run in await reader.list_runs(agent_name='librarian')] == ['turn-1', 'turn-2', 'turn-3']
    assert [event.kind for event in await reader.list_events(run_id='turn-2')] == ['run_completed']
    assert await reader.get_tool_effect(run_id='turn-2', tool_call_id='c') is not None
    latest = await reader.latest_snapshot(run_id='turn-3')
    assert latest is not None and dump(latest.messages) == dump(sample_history(6, tag='chat'))
    [summary] = [s for s in await reader.list_conversations() if s.conversation_id == 'chat']
    assert (summary.run_count, summary.head_run_id) == (3, 'turn-3')


async def test_its_runs_are_deleted_and_registered_again_in_the_new_spelling(directory: Path) -> None:
    store = FileStepStore(directory, fsync=False)
    await store.delete_run(run_id='turn-2')
    assert [run.run_id for run in await store.list_runs(conversation_id='chat')] == ['turn-1']
    again = RunRecord(run_id='turn-2', conversation_id='chat')
    await store.register_run(again)
    assert RunRecord.model_validate_json((directory / 'turn-2' / 'run.json').read_bytes()) == again
    assert [run.run_id for run in await FileStepStore(directory).list_runs(conversation_id='chat')] == [
        'turn-1',
        'turn-2',
    ]
    fork = await store.latest_snapshot(run_id='fork')
    assert fork is not None and dump(fork.messages) == dump(forked_history()), 'a branch keeps its base'
