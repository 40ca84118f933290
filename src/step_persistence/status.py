"""What state a run is in, derived from what it persisted, and the delegation tree of runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from step_persistence.protocol import StepStore
from step_persistence.records import RunRecord, RunStatus, StepEvent, ToolEffectRecord, utc_now

__all__ = ['DEFAULT_STALE_AFTER', 'RunNode', 'RunStatus', 'load_run_tree', 'run_status']

DEFAULT_STALE_AFTER = timedelta(minutes=30)


def run_status(
    events: Sequence[StepEvent],
    unresolved: Sequence[ToolEffectRecord],
    *,
    now: datetime | None = None,
    stale_after: timedelta = DEFAULT_STALE_AFTER,
) -> RunStatus:
    """The status of a run from its events (append order) and its unresolved tool effects.

    A run with unresolved effects and no terminal event may still be executing that tool; it is
    reported `crashed` because that is what a reader must assume about the side effect.
    """
    for event in reversed(events):
        if event.kind == 'run_completed':
            return 'completed'
        if event.kind == 'run_failed':
            return 'failed'
    if unresolved:
        return 'crashed'
    last_activity = max((event.timestamp for event in events), default=None)
    if last_activity is not None and (now or utc_now()) - last_activity > stale_after:
        return 'crashed'
    return 'running'


@dataclass
class RunNode:
    """One run in a delegation tree, with what a reader needs to judge it."""

    record: RunRecord
    status: RunStatus
    unresolved: list[ToolEffectRecord]
    children: list[RunNode] = field(default_factory=list['RunNode'])


async def load_run_tree(store: StepStore, run_id: str, *, now: datetime | None = None) -> RunNode:
    """The run and, recursively, every run it delegated to (by `parent_run_id`), oldest first.

    Raises `LookupError` if the run does not exist.
    """
    record = await store.get_run(run_id=run_id)
    if record is None:
        raise LookupError(f'run {run_id!r} does not exist')
    return await _node(store, record, now=now or utc_now(), seen={run_id})


async def _node(store: StepStore, record: RunRecord, *, now: datetime, seen: set[str]) -> RunNode:
    unresolved = await store.list_unresolved_tool_effects(run_id=record.run_id)
    status = run_status(await store.list_events(run_id=record.run_id), unresolved, now=now)
    node = RunNode(record=record, status=status, unresolved=unresolved)
    for child in await store.list_runs(parent_run_id=record.run_id):
        if child.run_id not in seen:
            seen.add(child.run_id)
            node.children.append(await _node(store, child, now=now, seen=seen))
    return node
