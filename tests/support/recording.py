"""A pass-through store that records every write, and helpers to replay them and compare contents."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

from step_persistence import (
    ContinuableSnapshot,
    RunRecord,
    StepEvent,
    StepStore,
    ToolEffectRecord,
)
from step_persistence.capability import register_run_once
from step_persistence.reclaiming import MediaCollection


@dataclass
class RecordingStore:
    """Delegates to `inner` and keeps `(method, record)` for every write, in order."""

    inner: StepStore
    writes: list[tuple[str, Any]] = field(default_factory=list[tuple[str, Any]])

    async def register_run(self, record: RunRecord) -> None:
        self.writes.append(('register_run', record))
        await self.inner.register_run(record)

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        return await self.inner.get_run(run_id=run_id)

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        return await self.inner.list_runs(parent_run_id=parent_run_id, conversation_id=conversation_id)

    async def append_event(self, event: StepEvent) -> None:
        self.writes.append(('append_event', event))
        await self.inner.append_event(event)

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        return await self.inner.list_events(run_id=run_id)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self.writes.append(('save_snapshot', snapshot))
        await self.inner.save_snapshot(snapshot)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        return await self.inner.latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        return await self.inner.list_snapshots(run_id=run_id, include_interrupted=include_interrupted)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self.writes.append(('record_tool_effect', record))
        await self.inner.record_tool_effect(record)

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        return await self.inner.get_tool_effect(run_id=run_id, tool_call_id=tool_call_id)

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        return await self.inner.list_unresolved_tool_effects(run_id=run_id)

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        return await self.inner.list_tool_effects(run_id=run_id)

    async def delete_run(self, *, run_id: str) -> None:
        await self.inner.delete_run(run_id=run_id)

    async def collect_media(self, *, grace: timedelta) -> MediaCollection:
        return await self.inner.collect_media(grace=grace)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def replay(store: StepStore, writes: list[tuple[str, Any]]) -> None:
    """Run recorded writes again, as a durable engine re-executing the capability's operations would."""
    for method, record in writes:
        if method == 'register_run':
            await register_run_once(store, record)
        else:
            await getattr(store, method)(record)


async def store_contents(store: StepStore) -> dict[str, Any]:
    """Everything readable through the protocol, for equality checks."""
    contents: dict[str, Any] = {}
    for run in await store.list_runs():
        effects = []
        for event in await store.list_events(run_id=run.run_id):
            if event.tool_call_id is not None:
                effects.append(await store.get_tool_effect(run_id=run.run_id, tool_call_id=event.tool_call_id))
        contents[run.run_id] = {
            'record': run,
            'events': await store.list_events(run_id=run.run_id),
            'snapshots': [
                snapshot.model_dump(mode='json')
                for snapshot in await store.list_snapshots(run_id=run.run_id, include_interrupted=True)
            ],
            'effects': effects,
            'unresolved': await store.list_unresolved_tool_effects(run_id=run.run_id),
        }
    return contents
