"""A SQLite store operation wakes the event loop once: the whole transaction is one worker-thread call.

Counted, never timed: every way a worker thread (anyio's, a driver's) hands a result back to the
event loop goes through `loop.call_soon_threadsafe`, so the calls made from other threads during
an operation are the operation's thread round trips.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

from step_persistence import ContinuableSnapshot, RunRecord, SqliteStepStore, StepEvent, ToolEffectRecord
from step_persistence.records import StepWrites
from step_persistence.testing.conformance import T0

pytestmark = pytest.mark.anyio


class WakeUps:
    """Counts the calls other threads make to wake the running event loop."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        wake = loop.call_soon_threadsafe
        self.count = 0

        def counted(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != loop_thread:
                self.count += 1
            return wake(*args, **kwargs)

        monkeypatch.setattr(loop, 'call_soon_threadsafe', counted)

    async def of(self, operation: Callable[[], Awaitable[object]]) -> int:
        before = self.count
        await operation()
        return self.count - before


@pytest.fixture(params=['file', 'memory', 'sqlite3 connection'])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqliteStepStore]:
    connection = sqlite3.connect(tmp_path / 'app.db', check_same_thread=False)
    stores = {
        'file': lambda: SqliteStepStore(tmp_path / 'runs.db'),
        'memory': lambda: SqliteStepStore(':memory:'),
        'sqlite3 connection': lambda: SqliteStepStore(connection=connection),
    }
    async with stores[request.param]() as opened:
        await opened.migrate()
        yield opened
    connection.close()


def history(step: int) -> list[ModelMessage]:
    """A history without large payloads (a payload adds a read of the media table when it is stored, and
    when it is read back)."""
    return [ModelRequest(parts=[UserPromptPart(content=f'prompt {number}', timestamp=T0)]) for number in range(step)]


def snapshot(step: int) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id='r', step_index=step, messages=history(step), idempotency_key=f's{step}')


def effect(status: Any) -> ToolEffectRecord:
    return ToolEffectRecord(run_id='r', tool_call_id='call', tool_name='lookup', status=status)


async def test_every_operation_is_one_thread_round_trip(
    store: SqliteStepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    wake_ups = WakeUps(monkeypatch)
    counts = {
        'register_run': await wake_ups.of(lambda: store.register_run(RunRecord(run_id='r'))),
        'append_event': await wake_ups.of(
            lambda: store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
        ),
        'record_tool_effect': await wake_ups.of(lambda: store.record_tool_effect(effect('started'))),
        'save_snapshot': await wake_ups.of(lambda: store.save_snapshot(snapshot(1))),
        'save_snapshot again': await wake_ups.of(lambda: store.save_snapshot(snapshot(2))),
        'write_batch': await wake_ups.of(
            lambda: store.write_batch(
                StepWrites(
                    tool_effects=[effect('completed')],
                    events=[StepEvent(run_id='r', kind='tool_call_completed', step_index=2, tool_call_id='call')],
                    snapshots=[snapshot(3)],
                )
            )
        ),
        'get_run': await wake_ups.of(lambda: store.get_run(run_id='r')),
        'list_events': await wake_ups.of(lambda: store.list_events(run_id='r')),
        'latest_snapshot': await wake_ups.of(lambda: store.latest_snapshot(run_id='r')),
        'list_snapshots': await wake_ups.of(lambda: store.list_snapshots(run_id='r')),
    }
    assert counts == dict.fromkeys(counts, 1)
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and latest.messages == history(3)
