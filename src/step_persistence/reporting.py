"""Run summaries and tool statistics computed through the `StepStore` protocol, for any backend.

The SQL stores expose the same figures as the `run_summary` and `tool_call_stats` views; these
functions are their definition for every other backend (and the reference the views are tested
against).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from step_persistence.protocol import StepStore, snapshot_states
from step_persistence.records import RunRecord, SnapshotState, StepEvent, ToolEffectRecord, utc_now
from step_persistence.status import DEFAULT_STALE_AFTER, RunStatus, run_status

__all__ = ['RunSummary', 'ToolStats', 'run_tool_effects', 'summarize_run', 'summarize_runs', 'tool_stats']

_TERMINAL_KINDS = ('run_completed', 'run_failed')


@dataclass(frozen=True)
class RunSummary:
    """One run at a glance: the columns of the `run_summary` view."""

    run_id: str
    agent_name: str | None
    conversation_id: str | None
    parent_run_id: str | None
    started_at: datetime
    ended_at: datetime | None
    """Timestamp of the run's terminal event, if it has one."""
    status: RunStatus
    duration_seconds: float | None
    model_requests: int
    tool_calls: int
    tool_failures: int
    unresolved_effects: int
    snapshots: int
    """Retained snapshots of any state."""
    latest_snapshot_state: SnapshotState | None
    input_tokens: int
    """Sum of `StepEvent.usage.input_tokens` over the run's events (0 when none has usage); cached ones included."""
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int


@dataclass(frozen=True)
class ToolStats:
    """One tool across runs: the columns of the `tool_call_stats` view (from the ledger)."""

    tool_name: str
    calls: int
    failures: int
    unresolved: int
    total_seconds: float
    """Sum of `ended_at - started_at` over settled calls (summed exactly, in microseconds)."""
    mean_seconds: float | None
    """`total_seconds` divided by the number of settled calls; `None` if there is none."""
    max_seconds: float | None


async def run_tool_effects(store: StepStore, run_id: str, events: Iterable[StepEvent]) -> list[ToolEffectRecord]:
    """The run's ledger records, in the order their calls first appear in `events`."""
    effects: list[ToolEffectRecord] = []
    seen: set[str] = set()
    for event in events:
        call_id = event.tool_call_id
        if call_id is None or call_id in seen:
            continue
        seen.add(call_id)
        effect = await store.get_tool_effect(run_id=run_id, tool_call_id=call_id)
        if effect is not None:
            effects.append(effect)
    return effects


async def summarize_run(
    store: StepStore, record: RunRecord, *, now: datetime | None = None, stale_after: timedelta = DEFAULT_STALE_AFTER
) -> RunSummary:
    """The summary of one run."""
    events = await store.list_events(run_id=record.run_id)
    unresolved = await store.list_unresolved_tool_effects(run_id=record.run_id)
    states = await snapshot_states(store, run_id=record.run_id)
    ended_at = next((event.timestamp for event in reversed(events) if event.kind in _TERMINAL_KINDS), None)
    usages = [event.usage for event in events if event.usage is not None]
    return RunSummary(
        run_id=record.run_id,
        agent_name=record.agent_name,
        conversation_id=record.conversation_id,
        parent_run_id=record.parent_run_id,
        started_at=record.started_at,
        ended_at=ended_at,
        status=run_status(events, unresolved, now=now or utc_now(), stale_after=stale_after),
        duration_seconds=None if ended_at is None else (ended_at - record.started_at).total_seconds(),
        model_requests=sum(event.kind == 'model_request_started' for event in events),
        tool_calls=sum(event.kind == 'tool_call_started' for event in events),
        tool_failures=sum(event.kind == 'tool_call_failed' for event in events),
        unresolved_effects=len(unresolved),
        snapshots=len(states),
        latest_snapshot_state=states[-1] if states else None,
        input_tokens=sum(usage.input_tokens for usage in usages),
        output_tokens=sum(usage.output_tokens for usage in usages),
        cache_read_tokens=sum(usage.cache_read_tokens for usage in usages),
        cache_write_tokens=sum(usage.cache_write_tokens for usage in usages),
    )


async def summarize_runs(
    store: StepStore,
    runs: Iterable[RunRecord] | None = None,
    *,
    now: datetime | None = None,
    stale_after: timedelta = DEFAULT_STALE_AFTER,
) -> list[RunSummary]:
    """Summaries of `runs` (default: every run, oldest first)."""
    records = await store.list_runs() if runs is None else list(runs)
    moment = now or utc_now()
    return [await summarize_run(store, record, now=moment, stale_after=stale_after) for record in records]


async def tool_stats(store: StepStore, runs: Iterable[RunRecord] | None = None) -> list[ToolStats]:
    """Per-tool statistics over the ledgers of `runs` (default: every run), by tool name."""
    by_tool: defaultdict[str, list[ToolEffectRecord]] = defaultdict(list)
    for record in await store.list_runs() if runs is None else runs:
        events = await store.list_events(run_id=record.run_id)
        for effect in await run_tool_effects(store, record.run_id, events):
            by_tool[effect.tool_name].append(effect)
    stats: list[ToolStats] = []
    for name in sorted(by_tool):
        effects = by_tool[name]
        durations = [
            effect.ended_at - effect.started_at
            for effect in effects
            if effect.ended_at is not None and effect.status != 'started'
        ]
        total_seconds = sum(durations, timedelta()).total_seconds()
        stats.append(
            ToolStats(
                tool_name=name,
                calls=len(effects),
                failures=sum(effect.status == 'failed' for effect in effects),
                unresolved=sum(effect.status == 'started' for effect in effects),
                total_seconds=total_seconds,
                mean_seconds=total_seconds / len(durations) if durations else None,
                max_seconds=max(durations).total_seconds() if durations else None,
            )
        )
    return stats
