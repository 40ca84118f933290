"""pydantic-ai-harness's records (as its stores spell them: JSON objects, rows, documents) as ours.

Its records have our fields, and one more: a run's `registration_id`, the harness's own stamp of
one registration of a run id, which is not carried over (a store of ours stamps its own). Its
timestamps are ISO 8601 text with an offset; its `metadata` a JSON object (text in SQL).
Validation is ours: a value our records refuse makes the item unreadable (skipped and logged by
the listings).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from step_persistence.records import RunRecord, StepEvent, ToolEffectRecord

__all__ = ['effect_from', 'event_from', 'run_from', 'snapshot_fields']

_RUN_FIELDS = ('run_id', 'conversation_id', 'parent_run_id', 'agent_name', 'metadata', 'started_at')
_EVENT_FIELDS = (
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
_EFFECT_FIELDS = (
    'run_id',
    'tool_call_id',
    'tool_name',
    'status',
    'started_at',
    'ended_at',
    'idempotency_key',
    'effect_summary',
)


def _fields(stored: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The named fields of a stored record (those it has), its `metadata` decoded when stored as JSON text."""
    fields = {name: stored[name] for name in names if name in stored}
    if isinstance(fields.get('metadata'), str):
        fields['metadata'] = json.loads(fields['metadata'])
    return fields


def run_from(stored: Mapping[str, Any]) -> RunRecord:
    """A harness run record (`registration_id` and any field of its store's own left out)."""
    return RunRecord.model_validate(_fields(stored, _RUN_FIELDS))


def event_from(stored: Mapping[str, Any]) -> StepEvent:
    return StepEvent.model_validate(_fields(stored, _EVENT_FIELDS))


def effect_from(stored: Mapping[str, Any]) -> ToolEffectRecord:
    return ToolEffectRecord.model_validate(_fields(stored, _EFFECT_FIELDS))


_SNAPSHOT_FIELDS = (
    'run_id',
    'step_index',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'timestamp',
    'state',
    'idempotency_key',
)


def snapshot_fields(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A harness snapshot's fields but its messages, as `ContinuableSnapshot` takes them (a `state` that is
    missing, from before the harness had one, reads as `complete`, as the harness reads it)."""
    fields = _fields(stored, _SNAPSHOT_FIELDS)
    if fields.get('state') is None:
        fields['state'] = 'complete'
    return fields
