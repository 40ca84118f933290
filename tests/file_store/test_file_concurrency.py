"""FileStepStore under concurrent writers: tasks of one process, and several processes on one run."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from file_store.file_layout import stored_message_lines
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord, ToolEffectRecord
from step_persistence._history import encode_messages
from step_persistence.records import RunOrigin
from step_persistence.retention import retained_seqs
from step_persistence.testing.conformance import sample_history
from step_persistence.testing.conformance.conversations import chat_history

pytestmark = pytest.mark.anyio

PROCESSES = 4
SAVES_PER_PROCESS = 25


def snapshot(run_id: str, step: int, **fields: Any) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=sample_history(1, tag=str(step)), **fields)


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def journal(directory: Path, run_id: str) -> list[dict[str, Any]]:
    lines = (directory / run_id / 'snapshots.jsonl').read_text().splitlines()
    return [json.loads(line) for line in lines]


def snapshot_files(directory: Path, run_id: str) -> list[int]:
    return sorted(int(path.stem) for path in (directory / run_id / 'snapshots').glob('*.json'))


# --- worker processes (module level so that the spawn start method can import them) ---


def _register(directory: str, worker: int, barrier: Barrier, results: Any) -> None:
    async def main() -> str:
        store = FileStepStore(directory)
        barrier.wait()
        try:
            await store.register_run(RunRecord(run_id='contested', agent_name=f'worker-{worker}'))
        except ValueError:
            return 'duplicate'
        return f'worker-{worker}'

    results.put(anyio.run(main))


def _save(directory: str, worker: int, barrier: Barrier, max_snapshots: int | None) -> None:
    async def main() -> None:
        store = FileStepStore(directory, max_snapshots_per_run=max_snapshots)
        barrier.wait()
        for number in range(SAVES_PER_PROCESS):
            state = 'interrupted' if (worker + number) % 3 == 0 else 'complete'
            await store.save_snapshot(snapshot('shared', worker * 1000 + number, state=state))

    anyio.run(main)


def _continue(directory: str, worker: int, barrier: Barrier, results: Any) -> None:
    """Register a run continuing snapshot 1 of `head`, then save three steps on it."""

    async def main() -> str:
        store = FileStepStore(directory)
        run_id = f'tab-{worker}'
        barrier.wait()
        await store.register_run(RunRecord(run_id=run_id, conversation_id='chat', origin=_HEAD_ORIGIN))
        for step in range(1, 4):
            await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=step, messages=_tab(worker, step)))
        record = await store.get_run(run_id=run_id)
        assert record is not None and record.origin is not None
        return record.origin.kind

    results.put(anyio.run(main))


_HEAD_ORIGIN = RunOrigin(kind='continued', run_id='head', seq=1)


def _tab(worker: int, step: int) -> list[ModelMessage]:
    return chat_history(2) + chat_history(step, tag=f'-tab-{worker}', start=2)


def _run_workers(target: Any, *args: Any) -> None:
    context = multiprocessing.get_context('spawn')
    barrier = context.Barrier(PROCESSES)
    processes = [context.Process(target=target, args=(args[0], worker, barrier, *args[1:])) for worker in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0] * PROCESSES


# --- tests ---


def test_duplicate_registration_across_processes_admits_exactly_one(tmp_path: Path) -> None:
    context = multiprocessing.get_context('spawn')
    results = context.Queue()
    _run_workers(_register, str(tmp_path), results)
    outcomes = sorted(results.get(timeout=10) for _ in range(PROCESSES))
    winners = [outcome for outcome in outcomes if outcome != 'duplicate']
    assert len(winners) == 1 and outcomes.count('duplicate') == PROCESSES - 1
    stored = json.loads((tmp_path / 'contested' / 'run.json').read_text())
    assert stored['agent_name'] == winners[0]
    assert list((tmp_path / '@tmp').iterdir()) == [], 'losers leave no staging directories behind'


async def test_fifty_concurrent_saves_in_one_process(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='busy'))
    await asyncio.gather(*(store.save_snapshot(snapshot('busy', step)) for step in range(50)))
    assert snapshot_files(tmp_path, 'busy') == list(range(1, 51))
    assert [line['seq'] for line in journal(tmp_path, 'busy')] == list(range(1, 51))
    saved = await FileStepStore(tmp_path).list_snapshots(run_id='busy')
    assert [item.seq for item in saved] == list(range(1, 51))
    assert sorted(item.step_index for item in saved) == list(range(50))


async def test_four_processes_saving_to_one_run_never_collide(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='shared'))
    await anyio.to_thread.run_sync(_run_workers, _save, str(tmp_path), None)

    total = PROCESSES * SAVES_PER_PROCESS
    assert snapshot_files(tmp_path, 'shared') == list(range(1, total + 1))
    lines = journal(tmp_path, 'shared')
    assert [line['seq'] for line in lines] == list(range(1, total + 1))
    saved = await store.list_snapshots(run_id='shared', include_interrupted=True)
    assert [item.seq for item in saved] == list(range(1, total + 1))
    for worker in range(PROCESSES):
        own = [item.step_index for item in saved if item.step_index // 1000 == worker]
        assert own == [worker * 1000 + number for number in range(SAVES_PER_PROCESS)], 'each writer in its own order'
    for item in saved:
        assert item.messages[0].parts[0].content == f'start {item.step_index} ✓'  # type: ignore[union-attr]


async def test_retention_with_four_processes_keeps_exactly_what_the_rule_keeps(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, max_snapshots_per_run=3)
    await store.register_run(RunRecord(run_id='shared'))
    await anyio.to_thread.run_sync(_run_workers, _save, str(tmp_path), 3)

    lines = journal(tmp_path, 'shared')
    assert [line['seq'] for line in lines] == list(range(1, PROCESSES * SAVES_PER_PROCESS + 1))
    expected = sorted(retained_seqs(((line['seq'], line['state']) for line in lines), 3))
    assert snapshot_files(tmp_path, 'shared') == expected
    retained = await store.list_snapshots(run_id='shared', include_interrupted=True)
    assert [item.seq for item in retained] == expected
    newest_complete = max(line['seq'] for line in lines if line['state'] == 'complete')
    latest = await store.latest_snapshot(run_id='shared')
    assert latest is not None and latest.seq == newest_complete


async def test_four_processes_continuing_one_snapshot_keep_every_history(tmp_path: Path) -> None:
    """Four tabs at once: one is stored as the continuation, three as forks; each history reads back."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='head', conversation_id='chat'))
    await store.save_snapshot(ContinuableSnapshot(run_id='head', step_index=1, messages=chat_history(2)))
    context = multiprocessing.get_context('spawn')
    results = context.Queue()
    await anyio.to_thread.run_sync(_run_workers, _continue, str(tmp_path), results)
    kinds = sorted(results.get(timeout=10) for _ in range(PROCESSES))
    assert kinds == ['continued'] + ['forked'] * (PROCESSES - 1)
    reader = FileStepStore(tmp_path)
    for worker in range(PROCESSES):
        stored = await reader.list_snapshots(run_id=f'tab-{worker}')
        assert [dump(item.messages) for item in stored] == [dump(_tab(worker, step)) for step in range(1, 4)]
    distinct = {message.digest for worker in range(PROCESSES) for message in encode_messages(_tab(worker, 3))}
    assert stored_message_lines(tmp_path) == len(distinct), 'the shared part is stored once'


async def test_calls_on_a_run_take_effect_in_the_order_they_were_made(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='ordered'))
    calls = [f'call-{number}' for number in range(40)]

    async def record(call_id: str, status: str) -> None:
        await store.record_tool_effect(
            ToolEffectRecord.model_validate(
                {'run_id': 'ordered', 'tool_call_id': call_id, 'tool_name': 'pay', 'status': status}
            )
        )

    async with anyio.create_task_group() as group:
        for call_id in calls:
            group.start_soon(record, call_id, 'completed')
            group.start_soon(record, call_id, 'failed')
    for call_id in calls:
        stored = await store.get_tool_effect(run_id='ordered', tool_call_id=call_id)
        assert stored is not None and stored.status == 'failed', call_id
