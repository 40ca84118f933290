"""Bare runs: the record a write to a run that was never registered registers for it.

Such a run has only its id and a `started_at`: the time of its first write (the first tool
effect's `started_at`, event's `timestamp` or snapshot's `timestamp`, in `StepWrites` order).
A later `register_run` of the id fills in every field once (see `StepStore`).
"""

from __future__ import annotations

from collections.abc import Sequence

from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord

__all__ = ['Write', 'bare_record', 'first_write', 'looks_bare']

Write = ToolEffectRecord | StepEvent | ContinuableSnapshot


def first_write(
    tool_effects: Sequence[ToolEffectRecord], events: Sequence[StepEvent], snapshots: Sequence[ContinuableSnapshot]
) -> Write:
    """The first of a run's writes in a batch, in `StepWrites` order (its tool effects, events, then snapshots)."""
    if tool_effects:
        return tool_effects[0]
    return events[0] if events else snapshots[0]


def bare_record(write: Write) -> RunRecord:
    """The record of the bare run that `write`, the run's first, registers: started when `write` says it happened."""
    started_at = write.started_at if isinstance(write, ToolEffectRecord) else write.timestamp
    return RunRecord(run_id=write.run_id, started_at=started_at)


def looks_bare(record: RunRecord) -> bool:
    """Whether `record` holds nothing but what a bare run's record holds (its id and `started_at`)."""
    return record == RunRecord(run_id=record.run_id, started_at=record.started_at)
