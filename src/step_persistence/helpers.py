"""Helpers for orchestrators: continue, fork, annotate, validate and inspect persisted runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic_ai.messages import ModelMessage
from pydantic_ai.tools import RunContext

from step_persistence._active import ACTIVE_RUN
from step_persistence._arguments import require_text
from step_persistence._history import answered_call_ids, tool_call_ids
from step_persistence.origins import tag_history
from step_persistence.protocol import StepStore
from step_persistence.records import ContinuableSnapshot, OriginKind, SnapshotState, ToolEffectRecord

__all__ = [
    'RecoveryReport',
    'annotate_tool_effect',
    'continue_run',
    'fork_run',
    'inspect_recovery',
    'is_provider_valid',
    'snapshot_state',
    'unanswered_tool_call_ids',
]


def unanswered_tool_call_ids(messages: Sequence[ModelMessage]) -> list[str]:
    """Ids of tool calls in `messages` that no later request answers, in call order."""
    pending: dict[str, None] = {}
    for message in messages:
        pending.update(dict.fromkeys(tool_call_ids(message)))
        for call_id in answered_call_ids(message):
            pending.pop(call_id, None)
    return list(pending)


def snapshot_state(messages: Sequence[ModelMessage]) -> SnapshotState:
    """`complete` when every tool call in `messages` has its result, else `interrupted`."""
    return 'interrupted' if unanswered_tool_call_ids(messages) else 'complete'


def is_provider_valid(messages: Sequence[ModelMessage]) -> bool:
    """Whether a provider would accept `messages` as history: every tool call answered once, no orphan results."""
    pending: set[str] = set()
    for message in messages:
        pending.update(tool_call_ids(message))
        for call_id in answered_call_ids(message):
            if call_id not in pending:
                return False
            pending.discard(call_id)
    return not pending


async def _pick_snapshot(
    store: StepStore,
    *,
    run_id: str,
    include_interrupted: bool,
    seq: int | None,
    step_index: int | None,
) -> ContinuableSnapshot:
    if seq is not None and step_index is not None:
        raise ValueError('pass at most one of seq and step_index')
    if seq is None and step_index is None:
        snapshot = await store.latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)
    else:
        candidates = [
            snapshot
            for snapshot in await store.list_snapshots(run_id=run_id, include_interrupted=include_interrupted)
            if (snapshot.seq == seq if seq is not None else snapshot.step_index == step_index)
        ]
        snapshot = candidates[-1] if candidates else None
    if snapshot is None:
        wanted = 'snapshot' if include_interrupted else 'complete snapshot'
        where = f' with seq={seq}' if seq is not None else f' at step {step_index}' if step_index is not None else ''
        raise LookupError(f'run {run_id!r} has no retained {wanted}{where}')
    return snapshot


async def continue_run(
    store: StepStore,
    *,
    run_id: str,
    include_interrupted: bool = False,
    seq: int | None = None,
    step_index: int | None = None,
) -> list[ModelMessage]:
    """The messages of the run's latest snapshot, for `Agent.run(message_history=...)`.

    Only `complete` snapshots are considered unless `include_interrupted=True` (check
    `list_unresolved_tool_effects` first: an interrupted history may make the model redo a call).
    Pass `seq` or `step_index` to pick an earlier retained snapshot (the newest one at that step).
    Raises `LookupError` when no snapshot matches.

    A run given these messages is recorded as `continued` from that snapshot (`RunRecord.origin`;
    `forked` if another run continued it already) and shares its stored messages.
    """
    snapshot = await _pick_snapshot(
        store, run_id=run_id, include_interrupted=include_interrupted, seq=seq, step_index=step_index
    )
    return _tagged(snapshot, kind='continued')


async def fork_run(
    store: StepStore,
    *,
    run_id: str,
    include_interrupted: bool = False,
    seq: int | None = None,
    step_index: int | None = None,
    conversation_id: str | None = None,
) -> list[ModelMessage]:
    """The same read as `continue_run`, for a new run that branches from that point: it is recorded as
    `forked` from the snapshot (`RunRecord.origin`) and shares its stored messages.

    With `conversation_id`, the newest message carries it, so the run given these messages (and
    the runs continuing it) belong to that conversation (pydantic-ai takes a run's conversation
    from its history); the other messages stay as stored.
    """
    snapshot = await _pick_snapshot(
        store, run_id=run_id, include_interrupted=include_interrupted, seq=seq, step_index=step_index
    )
    if conversation_id is not None and snapshot.messages:
        require_text('conversation_id', conversation_id)
        newest = dataclasses.replace(snapshot.messages[-1], conversation_id=conversation_id)
        snapshot = snapshot.model_copy(update={'messages': [*snapshot.messages[:-1], newest]})
    return _tagged(snapshot, kind='forked')


def _tagged(snapshot: ContinuableSnapshot, *, kind: OriginKind) -> list[ModelMessage]:
    if snapshot.seq is None:  # read from a store, it has one
        raise ValueError(f'snapshot of run {snapshot.run_id!r} has no seq')
    return tag_history(snapshot.messages, kind=kind, run_id=snapshot.run_id, seq=snapshot.seq)


async def annotate_tool_effect(
    store: StepStore,
    ctx: RunContext[object],
    *,
    idempotency_key: str | None = None,
    effect_summary: str | None = None,
) -> None:
    """Record, from inside a tool, how its side effect can be recognised or undone.

    Merges the given fields into the ledger record of the tool call `ctx` belongs to, in the run
    persisted by the enclosing `StepPersistence`; the terminal `completed`/`failed` write keeps them.
    Does nothing when called outside a tool call that `StepPersistence` is recording.
    """
    active = ACTIVE_RUN.get()
    tool_call_id = ctx.tool_call_id
    if active is None or tool_call_id is None:
        return
    record = active.in_flight.get(tool_call_id)
    if record is None:
        return
    changes = {
        name: value
        for name, value in (('idempotency_key', idempotency_key), ('effect_summary', effect_summary))
        if value is not None
    }
    record = record.model_copy(update=changes)
    active.in_flight[tool_call_id] = record
    await store.record_tool_effect(record)


@dataclass(frozen=True)
class RecoveryReport:
    """What a crashed or finished run left behind, for deciding how to resume it."""

    run_id: str
    latest_snapshot: ContinuableSnapshot | None
    """The newest retained snapshot of any state."""
    latest_complete_snapshot: ContinuableSnapshot | None
    """The newest retained `complete` snapshot: the safe point to continue from."""
    unresolved_effects: list[ToolEffectRecord]
    """Tool calls still `started`: their side effects may or may not have happened."""
    completed_tools: list[str]
    """Names of tools whose calls completed, in ledger order."""
    failed_tools: list[str]
    """Names of tools whose calls failed, in ledger order."""

    # The seed's names for the same fields.

    @property
    def latest(self) -> ContinuableSnapshot | None:
        """`latest_snapshot`."""
        return self.latest_snapshot

    @property
    def settled(self) -> ContinuableSnapshot | None:
        """`latest_complete_snapshot`."""
        return self.latest_complete_snapshot

    @property
    def unresolved(self) -> list[ToolEffectRecord]:
        """`unresolved_effects`."""
        return self.unresolved_effects

    @property
    def completed(self) -> list[str]:
        """`completed_tools`."""
        return self.completed_tools

    @property
    def failed(self) -> list[str]:
        """`failed_tools`."""
        return self.failed_tools


async def inspect_recovery(store: StepStore, *, run_id: str) -> RecoveryReport:
    """Summarise a run's recoverable state. Reads only; never executes anything.

    Raises `LookupError` for a run that is not stored, as `continue_run` does.
    """
    if await store.get_run(run_id=run_id) is None:
        raise LookupError(f'run {run_id!r} is not stored')
    latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    latest_complete = latest if latest is not None and latest.state == 'complete' else None
    if latest is not None and latest_complete is None:
        latest_complete = await store.latest_snapshot(run_id=run_id)
    unresolved = await store.list_unresolved_tool_effects(run_id=run_id)
    settled: dict[str, ToolEffectRecord] = {}
    for event in await store.list_events(run_id=run_id):
        call_id = event.tool_call_id
        # From the `started` event on: a crash may keep a call's ending ledger record without its ending event.
        if event.kind.startswith('tool_call_') and call_id is not None and call_id not in settled:
            effect = await store.get_tool_effect(run_id=run_id, tool_call_id=call_id)
            if effect is not None and effect.status != 'started':
                settled[call_id] = effect
    return RecoveryReport(
        run_id=run_id,
        latest_snapshot=latest,
        latest_complete_snapshot=latest_complete,
        unresolved_effects=unresolved,
        completed_tools=[effect.tool_name for effect in settled.values() if effect.status == 'completed'],
        failed_tools=[effect.tool_name for effect in settled.values() if effect.status == 'failed'],
    )
