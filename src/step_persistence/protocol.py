"""The async `StepStore` protocol that every backend implements identically."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from step_persistence.records import (
    ContinuableSnapshot,
    ConversationSummary,
    RunRecord,
    RunStatus,
    SnapshotRef,
    SnapshotState,
    StepEvent,
    StepWrites,
    ToolEffectRecord,
)

if TYPE_CHECKING:
    from step_persistence.reclaiming import MediaCollection

__all__ = [
    'BatchingStepStore',
    'StepStore',
    'SupportsSnapshotStates',
    'batch_writer',
    'snapshot_states',
    'write_each',
    'write_steps',
]


@runtime_checkable
class StepStore(Protocol):
    """Durable storage for runs, their event logs, snapshots and tool-effect ledgers.

    Every method is a coroutine and never blocks the event loop. A persisted item that cannot be
    read is skipped and logged by listings, and `latest_snapshot` falls back to the next readable
    snapshot.

    A write (`append_event`, `save_snapshot`, `record_tool_effect`, or a batch) for a run that is
    not stored registers it *bare*: `RunRecord(run_id=..., started_at=<the first write's own
    timestamp>)`, every other field left empty (an event's or snapshot's `conversation_id`,
    `agent_name` and `parent_run_id` are the write's, not the run's). A bare run is a run like any
    other (listed, reported, deleted and pruned as one) until `register_run` fills it in; writes
    racing to register one run id register it once.
    """

    async def register_run(self, record: RunRecord) -> None:
        """Insert a run; raise `ValueError` if its `run_id` is already stored (atomically).

        A bare run (registered by a write) is filled in instead, once: its record becomes `record`
        (every field, `started_at` too), and it keeps its events, snapshots, tool effects and its
        place in registration order; a second `register_run` raises `ValueError`.

        A `continued` origin whose snapshot another stored run already continued is stored as
        `forked` (atomically too: of two runs continuing one snapshot at once, one is the fork).
        """
        ...

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        """The run's record, or `None`."""
        ...

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
        """Runs matching every given filter, oldest `started_at` first (ties in registration order).

        `origin_run_id`: the runs continued or forked from one of that run's snapshots.
        `run_id_prefix`: the runs whose id starts with it (case-sensitive, `%` and `_` are plain
        characters; `''` matches every run).
        `newest_first=True` reverses the order; `limit` keeps the first `limit` of that order (a
        `limit` below 1, or one that is not an `int`, raises `ValueError`/`TypeError`).
        """
        ...

    async def list_conversations(
        self, *, limit: int | None = None, newest_first: bool = True, agent_name: str | None = None
    ) -> list[ConversationSummary]:
        """One summary per `conversation_id` among the runs (only those of `agent_name`, when given),
        ordered by `last_started_at` then `conversation_id`, newest first unless `newest_first=False`.

        Runs without a `conversation_id` belong to none. `limit` as in `list_runs`.
        """
        ...

    async def find_snapshot(self, *, conversation_id: str, history_digest: str) -> SnapshotRef | None:
        """The newest retained snapshot (of any state) of the conversation's runs whose history has
        `history_digest` (`ContinuableSnapshot.history_digest()`), or `None`.

        Newest: of the newest run (`list_runs` order) holding one, its highest `seq`.
        """
        ...

    async def append_event(self, event: StepEvent) -> None:
        """Append an event; a repeated non-null `idempotency_key` for the same run writes nothing."""
        ...

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        """The run's events in append order."""
        ...

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        """Append a snapshot under the run's next sequence number, then apply retention.

        A repeated non-null `idempotency_key` for the same run writes nothing, even if the snapshot
        first written with it has since been pruned.
        """
        ...

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest `complete` snapshot (or newest of any state), or `None`."""
        ...

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """Retained snapshots in sequence order (only `complete` ones unless asked)."""
        ...

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        """Upsert by `(run_id, tool_call_id)`; a stored `idempotency_key`/`effect_summary` survives a null."""
        ...

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        """The ledger record, or `None`."""
        ...

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        """Records still `started`, oldest `started_at` first."""
        ...

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        """Every tool effect of the run (any status), oldest `started_at` first, ties by `tool_call_id`.

        `[]` for an unknown run.
        """
        ...

    async def delete_run(self, *, run_id: str, cascade: bool = False) -> None:
        """Remove the run with its events, snapshots, effects and the stored messages no other run's
        history uses (never shared media); the histories of runs that continued or forked from it
        read back unchanged.

        `cascade=True` also removes every run delegated from it, transitively (every run whose
        `parent_run_id` chain leads to `run_id`, also when `run_id` itself is already gone), each
        before the run it was delegated from, so a cascade that was interrupted can be run again.
        Deleting a run that is not stored is a no-op.
        """
        ...

    async def prune_runs(
        self,
        *,
        older_than: datetime,
        statuses: Collection[RunStatus] | None = None,
        include_running: bool = False,
    ) -> list[str]:
        """Delete whole runs that started before `older_than` whose status is in `statuses` (`None`: any).

        The status is `step_persistence.status.run_status` of the run's events and unresolved
        effects. A `running` run is never deleted unless `include_running=True`. A naive
        `older_than` raises `ValueError`, as does a status that does not exist. Returns the ids of
        the deleted runs, oldest `started_at` first. Delegated runs are not followed: each run is
        judged on its own.
        """
        ...

    async def collect_media(self, *, grace: timedelta) -> MediaCollection:
        """Reclaim stored messages that no retained snapshot references and media blobs that no stored
        message references, leaving anything written (or reused) within `grace`. Safe while other writers
        are active (when `grace` covers `REUSE_WINDOW` plus the longest save; see docs/media.md).

        Raises `ValueError` for a `grace` that is not a `timedelta` >= 0.
        """
        ...

    async def aclose(self) -> None:
        """Release what the store owns (never what the caller passed in)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class BatchingStepStore(StepStore, Protocol):
    """A store that applies several writes at once (one transaction, one round trip where it can)."""

    async def write_batch(self, writes: StepWrites) -> None:
        """Apply `writes` with exactly the effect of the individual calls in their order."""
        ...


@runtime_checkable
class SupportsSnapshotStates(StepStore, Protocol):
    """A store that reads the states of a run's snapshots without reading their messages."""

    async def list_snapshot_states(self, *, run_id: str) -> list[SnapshotState]:
        """The state of each retained snapshot of the run, in sequence order: what
        `[s.state for s in await list_snapshots(run_id=..., include_interrupted=True)]` gives, without
        reading (or decoding) a message. `[]` for an unknown run; a snapshot whose state cannot be read is
        skipped and logged."""
        ...


async def snapshot_states(store: StepStore, *, run_id: str) -> list[SnapshotState]:
    """The states of the run's retained snapshots, in sequence order, from any store: its
    `list_snapshot_states` (`SupportsSnapshotStates`, looked up by name as `batch_writer` does), else
    `list_snapshots`, which reads the messages too."""
    list_states = getattr(store, 'list_snapshot_states', None)
    if callable(list_states):
        states: list[SnapshotState] = await list_states(run_id=run_id)
        return states
    return [snapshot.state for snapshot in await store.list_snapshots(run_id=run_id, include_interrupted=True)]


def batch_writer(store: StepStore) -> Callable[[StepWrites], Awaitable[None]] | None:
    """The store's `write_batch` method if it has one (`BatchingStepStore`), else `None`.

    Looked up by name: an `isinstance` check against the runtime-checkable protocol inspects
    every protocol member at each call, and would fall back to one call per write for a store
    that batches but lacks some unrelated method. Callers that write often look it up once.
    """
    write_batch = getattr(store, 'write_batch', None)
    return write_batch if callable(write_batch) else None


async def write_steps(
    store: StepStore, writes: StepWrites, *, write_batch: Callable[[StepWrites], Awaitable[None]] | None = None
) -> None:
    """Apply `writes` to any store: in one batch if it batches, else call by call in order.

    `write_batch`: `batch_writer(store)` when the caller already looked it up.
    """
    write_batch = write_batch or batch_writer(store)
    if write_batch is not None:
        await write_batch(writes)
        return
    await write_each(store, writes)


async def write_each(store: StepStore, writes: StepWrites) -> None:
    """Apply `writes` with one store call per write, in `StepWrites` order."""
    for effect in writes.tool_effects:
        await store.record_tool_effect(effect)
    for event in writes.events:
        await store.append_event(event)
    for snapshot in writes.snapshots:
        await store.save_snapshot(snapshot)
