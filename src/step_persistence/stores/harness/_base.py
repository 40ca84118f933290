"""`HarnessStore`: the `StepStore` protocol, read-only, over what pydantic-ai-harness stored.

Each backend module says how to read its stored items (runs, a run's events, effects and
snapshots, a blob); this class turns them into our records, in our orders, with the protocol's
argument checks, and refuses every write with `ReadOnlyStoreError`.

- Runs are listed in `started_at` order, ties in the order the harness stored them.
- Snapshots are numbered 1, 2, 3... per run in the harness's order (its own numbers start at 0 in
  its file store and run across all runs in SQL).
- A tool effect's latest stored version wins (the file store appends one line per change).
- Media markers are restored from the harness's media (or from the `media_store` given).
- An item that cannot be read is skipped and logged, as every store of ours does (with `strict`, it raises).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NoReturn, TypeVar

from step_persistence._arguments import require_text
from step_persistence._closing import ClosesOnExit
from step_persistence._reading import read_each, read_or_skip_async
from step_persistence.media.protocol import MediaStore
from step_persistence.records import (
    ContinuableSnapshot,
    ConversationSummary,
    RunRecord,
    RunStatus,
    SnapshotRef,
    StepEvent,
    ToolEffectRecord,
)
from step_persistence.stores._listing import ConversationFilter, RunFilter, conversation_summaries
from step_persistence.stores.harness._messages import restore_messages
from step_persistence.stores.harness._records import effect_from, event_from, run_from, snapshot_fields

__all__ = ['HarnessStore', 'ReadOnlyStoreError', 'StoredSnapshot']

T = TypeVar('T')

Stored = Mapping[str, Any]
"""One stored item as the harness spelt it: a JSON object, a row, a document."""


class ReadOnlyStoreError(ValueError):
    """A write to a store that pydantic-ai-harness wrote: those are only read (copy their runs to a store of ours)."""


@dataclass(frozen=True)
class StoredSnapshot:
    """One snapshot as stored: its fields, and its messages as JSON (references to stored messages resolved)."""

    fields: Stored
    messages: Any


class HarnessStore(ClosesOnExit):
    """A store pydantic-ai-harness wrote, read through our protocol; every write raises `ReadOnlyStoreError`."""

    def __init__(self, *, media_store: MediaStore | None = None, strict: bool = False) -> None:
        self._media_store = media_store
        self._strict = strict
        """Raise on an item that cannot be read instead of skipping it (adoption: every item or none)."""

    def _each(self, items: list[Stored], describe: Callable[[Stored], str], build: Callable[[Stored], T]) -> list[T]:
        if self._strict:
            return [build(item) for item in items]
        return read_each(items, describe, build)

    # --- what each backend reads ---

    @abstractmethod
    async def _read_runs(self) -> list[Stored]:
        """Every run, in the order the harness stored them."""

    @abstractmethod
    async def _read_events(self, run_id: str) -> list[Stored]:
        """The run's events in append order."""

    @abstractmethod
    async def _read_effects(self, run_id: str) -> list[Stored]:
        """The run's tool effects; of several versions of one, the newest last."""

    @abstractmethod
    async def _read_snapshots(self, run_id: str) -> list[StoredSnapshot]:
        """The run's snapshots in the harness's order."""

    @abstractmethod
    async def _read_blob(self, uri: str) -> bytes:
        """A blob of the harness's media store (`LookupError` if it has none)."""

    @property
    @abstractmethod
    def description(self) -> str:
        """Where the store is, for messages (no password)."""

    # --- runs ---

    async def _runs(self) -> list[tuple[RunRecord, int]]:
        stored = await self._read_runs()
        records = self._each(stored, lambda item: f'harness run {item.get("run_id")!r}', run_from)
        return [(record, registration) for registration, record in enumerate(records)]

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        require_text('run_id', run_id)
        return next((record for record, _ in await self._runs() if record.run_id == run_id), None)

    async def list_runs(
        self,
        *,
        parent_run_id: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        origin_run_id: str | None = None,
        run_id_prefix: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[RunRecord]:
        chosen = RunFilter(
            parent_run_id=parent_run_id,
            conversation_id=conversation_id,
            agent_name=agent_name,
            origin_run_id=origin_run_id,
            run_id_prefix=run_id_prefix,
            limit=limit,
            newest_first=newest_first,
        )
        return chosen.select(await self._runs())

    async def list_conversations(
        self, *, limit: int | None = None, newest_first: bool = True, agent_name: str | None = None
    ) -> list[ConversationSummary]:
        chosen = ConversationFilter(limit=limit, newest_first=newest_first, agent_name=agent_name)
        return conversation_summaries(await self._runs(), chosen)

    async def find_snapshot(self, *, conversation_id: str, history_digest: str) -> SnapshotRef | None:
        require_text('conversation_id', conversation_id)
        require_text('history_digest', history_digest)
        for record in await self.list_runs(conversation_id=conversation_id, newest_first=True):
            for snapshot in reversed(await self.list_snapshots(run_id=record.run_id, include_interrupted=True)):
                if snapshot.history_digest() == history_digest and snapshot.seq is not None:
                    return SnapshotRef(run_id=record.run_id, seq=snapshot.seq)
        return None

    # --- events and snapshots ---

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        require_text('run_id', run_id)
        stored = await self._read_events(run_id)
        return self._each(stored, lambda _: f'harness event of run {run_id!r}', event_from)

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        require_text('run_id', run_id)
        snapshots: list[ContinuableSnapshot] = []
        for seq, stored in enumerate(await self._read_snapshots(run_id), start=1):
            read = partial(self._snapshot, stored, seq)
            snapshot = (
                await read()
                if self._strict
                else await read_or_skip_async(f'harness snapshot {seq} of run {run_id!r}', read)
            )
            if snapshot is not None and (include_interrupted or snapshot.state == 'complete'):
                snapshots.append(snapshot)
        return snapshots

    async def _snapshot(self, stored: StoredSnapshot, seq: int) -> ContinuableSnapshot:
        messages = await restore_messages(stored.messages, self._blob)
        return ContinuableSnapshot.model_validate({**snapshot_fields(stored.fields), 'messages': messages, 'seq': seq})

    async def _blob(self, uri: str) -> bytes:
        if self._media_store is not None:
            return await self._media_store.get(uri)
        return await self._read_blob(uri)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        snapshots = await self.list_snapshots(run_id=run_id, include_interrupted=include_interrupted)
        return snapshots[-1] if snapshots else None

    # --- the ledger ---

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        require_text('run_id', run_id)
        stored = await self._read_effects(run_id)
        versions = self._each(stored, lambda _: f'harness tool effect of run {run_id!r}', effect_from)
        latest = {effect.tool_call_id: effect for effect in versions}
        return sorted(latest.values(), key=lambda effect: (effect.started_at, effect.tool_call_id))

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        require_text('tool_call_id', tool_call_id)
        effects = await self.list_tool_effects(run_id=run_id)
        return next((effect for effect in effects if effect.tool_call_id == tool_call_id), None)

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        return [effect for effect in await self.list_tool_effects(run_id=run_id) if effect.status == 'started']

    # --- writes: refused ---

    def _refuse(self, operation: str) -> NoReturn:
        raise ReadOnlyStoreError(
            f'{self.description} was written by pydantic-ai-harness and is only read here ({operation} refused): '
            'copy its runs to a store of ours (`step-persistence copy`, or `copy_runs`) and write there'
        )

    async def register_run(self, record: RunRecord) -> None:
        self._refuse('register_run')

    async def append_event(self, event: StepEvent) -> None:
        self._refuse('append_event')

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self._refuse('save_snapshot')

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self._refuse('record_tool_effect')

    async def delete_run(self, *, run_id: str, cascade: bool = False) -> None:
        self._refuse('delete_run')

    async def prune_runs(
        self,
        *,
        older_than: datetime,
        statuses: Collection[RunStatus] | None = None,
        include_running: bool = False,
    ) -> list[str]:
        self._refuse('prune_runs')

    async def collect_media(self, *, grace: timedelta) -> Any:
        self._refuse('collect_media')

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.description})'
