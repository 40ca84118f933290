"""The cost of a step does not grow with the run: bytes read and written per append stay flat."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

from file_store.file_layout import messages_of
from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord, StepEvent, ToolEffectRecord

pytestmark = pytest.mark.anyio

STEPS = 300


def grow(history: list[ModelMessage], step: int) -> None:
    """One tool cycle: a response calling a tool, and the request returning its result."""
    call_id = f'call-{step:05d}'
    history.append(ModelResponse(parts=[ToolCallPart('lookup', {'step': f'{step:05d}'}, call_id)]))
    history.append(ModelRequest(parts=[ToolReturnPart('lookup', f'result {step:05d}', call_id)]))


Operation = Callable[[], Awaitable[None]]


def step_operations(store: FileStepStore, history: list[ModelMessage], step: int) -> dict[str, Operation]:
    call_id = f'call-{step:05d}'
    return {
        'append_event': lambda: store.append_event(
            StepEvent(run_id='long', kind='tool_call_started', step_index=step, idempotency_key=f'event-{step:05d}')
        ),
        'record_tool_effect': lambda: store.record_tool_effect(
            ToolEffectRecord(run_id='long', tool_call_id=call_id, tool_name='lookup', status='completed')
        ),
        'save_snapshot': lambda: store.save_snapshot(
            ContinuableSnapshot(
                run_id='long', step_index=step, messages=list(history), idempotency_key=f'snapshot-{step:05d}'
            )
        ),
    }


async def measure(store: FileStepStore, operation: Operation) -> tuple[int, int]:
    """`(bytes read, bytes written)` by one call."""
    before = (store.io_counters.bytes_read, store.io_counters.bytes_written)
    await operation()
    return store.io_counters.bytes_read - before[0], store.io_counters.bytes_written - before[1]


async def test_bytes_per_append_stay_bounded_as_the_run_grows(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='long'))
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('start a long run')])]
    costs: dict[str, list[tuple[int, int]]] = {}
    for step in range(1, STEPS + 1):
        grow(history, step)
        for name, operation in step_operations(store, history, step).items():
            costs.setdefault(name, []).append(await measure(store, operation))

    for name, per_step in costs.items():
        reads = [read for read, _ in per_step[1:]]
        writes = [written for _, written in per_step[1:]]
        # After the first call indexed the run, an append reads the lock files' tokens (the run's,
        # and its line's for a save) and one byte of each file it catches up with, whatever the
        # run's length.
        assert max(reads) <= 2 * 32 + 8, (name, max(reads))
        assert reads[-1] == reads[0], (name, reads[0], reads[-1])
        assert max(writes) - min(writes) <= 32, (name, min(writes), max(writes))  # numbers gain digits
    snapshot_bytes = costs['save_snapshot'][-1][1]
    history_bytes = messages_of(tmp_path, 'long').stat().st_size
    assert snapshot_bytes * 100 < history_bytes, 'a snapshot writes its new messages, not the history'


async def test_a_new_process_indexes_a_run_once(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='long'))
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('start a long run')])]
    for step in range(1, 101):
        grow(history, step)
        for operation in step_operations(store, history, step).values():
            await operation()

    reopened = FileStepStore(tmp_path, fsync=False)
    grow(history, 101)
    first = {name: await measure(reopened, op) for name, op in step_operations(reopened, history, 101).items()}
    grow(history, 102)
    second = {name: await measure(reopened, op) for name, op in step_operations(reopened, history, 102).items()}
    for name in first:
        assert first[name][0] > 1000, 'the first call reads what it needs of the run once'
        assert second[name][0] <= 2 * 32 + 8, (name, second[name])
