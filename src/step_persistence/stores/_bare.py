"""Bare runs: the record a write to a run that was never registered registers for it.

Such a run has only its id and a `started_at`: the time of its first write (the first tool
effect's `started_at`, event's `timestamp` or snapshot's `timestamp`, in `StepWrites` order).
A later `register_run` of the id fills in every field once (see `StepStore`).
"""

from __future__ import annotations

from datetime import datetime

from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord

__all__ = ['bare_record', 'first_write_time', 'looks_bare']

Write = ToolEffectRecord | StepEvent | ContinuableSnapshot


def first_write_time(write: Write) -> datetime:
    """When `write` happened, by its own timestamp: the `started_at` a bare run it registers gets."""
    return write.started_at if isinstance(write, ToolEffectRecord) else write.timestamp


def bare_record(write: Write) -> RunRecord:
    """The record of the bare run that `write`, the run's first, registers."""
    return RunRecord(run_id=write.run_id, started_at=first_write_time(write))


def looks_bare(record: RunRecord) -> bool:
    """Whether `record` holds nothing but what a bare run's record holds (its id and `started_at`)."""
    return record == RunRecord(run_id=record.run_id, started_at=record.started_at)
