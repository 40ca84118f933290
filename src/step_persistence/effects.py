"""Tool effects across runs: has an earlier run already done this, and closing an effect left unresolved.

`find_tool_effects` lets a tool check, before acting, whether any run recorded a side effect under
the same idempotency key. `resolve_tool_effect` lets an orchestrator (or a person, through
`step-persistence runs resolve`) close a ledger record a crash left `started`, once it has checked
the outside world: the record is settled with what was found, and an event says it was settled
from outside the run.
"""

from __future__ import annotations

from typing import Literal

from step_persistence.protocol import StepStore
from step_persistence.records import StepEvent, ToolEffectRecord, utc_now

__all__ = ['RESOLUTION_METADATA_KEY', 'ResolvedStatus', 'find_tool_effects', 'resolve_tool_effect']

ResolvedStatus = Literal['completed', 'failed']
"""What a resolution found: the side effect happened (`completed`) or did not (`failed`)."""

RESOLUTION_METADATA_KEY = 'resolved_by'
RESOLVED_AT_METADATA_KEY = 'resolved_at'
"""The metadata key of the event `resolve_tool_effect` appends: who settled the effect from outside the run."""


async def find_tool_effects(
    store: StepStore,
    *,
    idempotency_key: str,
    conversation_id: str | None = None,
    parent_run_id: str | None = None,
) -> list[ToolEffectRecord]:
    """Every ledger record, in any run, whose idempotency key is exactly `idempotency_key`.

    Runs oldest first, each run's records oldest first. `conversation_id` and `parent_run_id`
    narrow the runs searched (as in `list_runs`). A `completed` record means an earlier call did
    the work; a `started` one that its outcome is unknown (see `resolve_tool_effect`).

    This reads through the protocol: one listing of the runs, then one ledger read per run, so its
    cost grows with the number of runs searched; narrow it where you can.
    """
    found: list[ToolEffectRecord] = []
    for record in await store.list_runs(conversation_id=conversation_id, parent_run_id=parent_run_id):
        effects = await store.list_tool_effects(run_id=record.run_id)
        found.extend(effect for effect in effects if effect.idempotency_key == idempotency_key)
    return found


async def resolve_tool_effect(
    store: StepStore,
    *,
    run_id: str,
    tool_call_id: str,
    status: ResolvedStatus,
    summary: str,
    resolved_by: str = 'resolve_tool_effect',
) -> ToolEffectRecord:
    """Settle an unresolved (`started`) tool effect as `completed` or `failed`, after checking the outside world.

    Writes the ledger record with `status`, `ended_at` now and `summary` as its `effect_summary`
    (its idempotency key is kept), then appends a `tool_call_completed` or `tool_call_failed`
    event at the call's step, with `metadata={'resolved_by': resolved_by, 'resolved_at': <ISO instant>}`
    (the summary is the event's `error` for `failed`). The event is stamped with the time of the
    run's newest event, so a crashed run stays `crashed` rather than looking active again.
    Returns the settled record.

    Resolving again with the same status and summary writes nothing new (the event has an
    idempotency key), so a script that died half way can run again. Raises `LookupError` when the
    run or the call does not exist, and `ValueError` for a status other than `completed` or
    `failed`, an empty summary, or a call already settled otherwise.
    """
    if status not in ('completed', 'failed'):
        raise ValueError(f"a tool effect is resolved as 'completed' or 'failed', not {status!r}")
    if not summary.strip():
        raise ValueError('say what was found: a resolution needs a summary')
    run = await store.get_run(run_id=run_id)
    if run is None:
        raise LookupError(f'run {run_id!r} does not exist')
    effect = await store.get_tool_effect(run_id=run_id, tool_call_id=tool_call_id)
    if effect is None:
        raise LookupError(f'run {run_id!r} has no tool call {tool_call_id!r}')
    if effect.status != 'started':
        if effect.status != status or effect.effect_summary != summary:
            raise ValueError(
                f'tool call {tool_call_id!r} of run {run_id!r} is already {effect.status} '
                f'({effect.effect_summary or "no summary"}); only an unresolved (started) call can be resolved'
            )
        settled = effect
    else:
        settled = effect.model_copy(update={'status': status, 'ended_at': utc_now(), 'effect_summary': summary})
        await store.record_tool_effect(settled)
    events = await store.list_events(run_id=run_id)
    resolved_at = settled.ended_at or utc_now()
    step_index = next(
        (event.step_index for event in events if event.tool_call_id == tool_call_id),
        events[-1].step_index if events else 0,
    )
    await store.append_event(
        StepEvent(
            run_id=run_id,
            kind='tool_call_completed' if status == 'completed' else 'tool_call_failed',
            step_index=step_index,
            conversation_id=run.conversation_id,
            parent_run_id=run.parent_run_id,
            agent_name=run.agent_name,
            tool_call_id=tool_call_id,
            tool_name=effect.tool_name,
            error=summary if status == 'failed' else None,
            # Stamped as of the run's last activity, so that settling a crashed run from outside does not
            # make it look alive again (run_status judges staleness by the newest event); the real
            # instant is kept in the metadata and in the ledger's `ended_at`.
            timestamp=max((event.timestamp for event in events), default=effect.started_at),
            metadata={RESOLUTION_METADATA_KEY: resolved_by, RESOLVED_AT_METADATA_KEY: resolved_at.isoformat()},
            idempotency_key=f'step_persistence.resolve::{tool_call_id}',
        )
    )
    return settled
