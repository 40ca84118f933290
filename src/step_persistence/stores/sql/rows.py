"""Records to table rows and back; reading validates, so a bad stored value raises `ValueError`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.sql.elements import ColumnElement

from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.stores.sql.schema import events, runs, snapshots, tool_effects

__all__ = [
    'EVENT_COLUMNS',
    'EVENT_FIELDS',
    'RUN_COLUMNS',
    'RUN_KEY',
    'SNAPSHOT_HEADER_COLUMNS',
    'TOOL_EFFECT_COLUMNS',
    'TOOL_EFFECT_FIELDS',
    'StoredHistory',
    'event_from_row',
    'event_values',
    'run_from_row',
    'run_values',
    'snapshot_header_from_row',
    'snapshot_values',
    'tool_effect_from_row',
    'tool_effect_values',
]

RUN_KEY = 'run'
"""The parameter naming the run of an event, tool effect or snapshot key (see `statements.py`)."""

_RUN_FIELDS = ('run_id', 'conversation_id', 'parent_run_id', 'agent_name', 'metadata', 'started_at')
EVENT_FIELDS = (
    'run_id',
    'kind',
    'step_index',
    'timestamp',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'tool_call_id',
    'tool_name',
    'error',
    'metadata',
    'idempotency_key',
)
_SNAPSHOT_FIELDS = (
    'run_id',
    'seq',
    'step_index',
    'timestamp',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'idempotency_key',
    'state',
)
TOOL_EFFECT_FIELDS = (
    'run_id',
    'tool_call_id',
    'tool_name',
    'status',
    'started_at',
    'ended_at',
    'idempotency_key',
    'effect_summary',
)

RUN_COLUMNS: tuple[ColumnElement[Any], ...] = tuple(runs.c[name] for name in _RUN_FIELDS)
EVENT_COLUMNS: tuple[ColumnElement[Any], ...] = tuple(events.c[name] for name in EVENT_FIELDS)
TOOL_EFFECT_COLUMNS: tuple[ColumnElement[Any], ...] = tuple(tool_effects.c[name] for name in TOOL_EFFECT_FIELDS)
SNAPSHOT_HEADER_COLUMNS: tuple[ColumnElement[Any], ...] = (
    *(snapshots.c[name] for name in _SNAPSHOT_FIELDS),
    snapshots.c.history_length,
    snapshots.c.through_message,
)
"""A snapshot row: its fields and the reference to its messages."""


@dataclass(frozen=True)
class StoredHistory:
    """Which `messages` rows make up a snapshot's history: for each position below `length`, the
    newest row numbered at most `through_message`."""

    length: int
    through_message: int


def run_values(record: RunRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in _RUN_FIELDS}


def run_from_row(row: Mapping[str, Any]) -> RunRecord:
    return RunRecord.model_validate({name: row[name] for name in _RUN_FIELDS})


def event_values(event: StepEvent) -> dict[str, Any]:
    """The parameters of `WriteStatements.append_event`: the event's fields, its run as `run`."""
    return {RUN_KEY if name == 'run_id' else name: getattr(event, name) for name in EVENT_FIELDS}


def event_from_row(row: Mapping[str, Any]) -> StepEvent:
    return StepEvent.model_validate({name: row[name] for name in EVENT_FIELDS})


def tool_effect_values(record: ToolEffectRecord) -> dict[str, Any]:
    """The parameters of `WriteStatements.record_tool_effect`: the record's fields, its run as `run`."""
    return {RUN_KEY if name == 'run_id' else name: getattr(record, name) for name in TOOL_EFFECT_FIELDS}


def tool_effect_from_row(row: Mapping[str, Any]) -> ToolEffectRecord:
    return ToolEffectRecord.model_validate({name: row[name] for name in TOOL_EFFECT_FIELDS})


def snapshot_values(snapshot: ContinuableSnapshot, *, seq: int, history: StoredHistory) -> dict[str, Any]:
    values = {name: getattr(snapshot, name) for name in _SNAPSHOT_FIELDS if name != 'seq'}
    return {**values, 'seq': seq, 'history_length': history.length, 'through_message': history.through_message}


def snapshot_header_from_row(row: Mapping[str, Any]) -> tuple[ContinuableSnapshot, StoredHistory]:
    """The snapshot without messages, and the reference to its messages; `ValueError` for a malformed row."""
    header = ContinuableSnapshot.model_validate({**{name: row[name] for name in _SNAPSHOT_FIELDS}, 'messages': []})
    length, through = row['history_length'], row['through_message']
    if not (isinstance(length, int) and isinstance(through, int) and length >= 0 and through >= 0):
        raise ValueError(f'malformed history reference: length {length!r}, through message {through!r}')
    return header, StoredHistory(length=length, through_message=through)
