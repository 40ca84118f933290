"""Records to MongoDB documents and back; reading validates, so a bad stored value raises `ValueError`.

Reading is strict: a stored value must have exactly the type this module writes (a string
`step_index`, a `seq` that is not a positive integer or a date written as text is damage, never
converted into something that looks true), so a damaged document is refused and its listing
skips it with a log line.

Two representation rules apply to every collection:

- A timestamp `<name>` is stored as a BSON date (millisecond precision, usable in queries and
  reports) plus `<name>_us`, the microseconds past that millisecond (0-999), so records read back
  exactly and sorting on `(<name>, <name>_us)` is sorting by true instant.
- Metadata (`dict[str, str]`) is an embedded document whose field names are the keys, with
  `%`, `.`, `$` and NUL percent-encoded (`%25`, `%2E`, `%24`, `%00`) and the empty key stored as
  `%`: every string key round-trips and every stored name can be queried as `metadata.<name>`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord

__all__ = [
    'decode_metadata_key',
    'encode_metadata_key',
    'event_document',
    'event_from_document',
    'run_document',
    'run_from_document',
    'snapshot_document',
    'snapshot_from_document',
    'tool_effect_from_document',
    'tool_effect_update',
    'with_time',
]

_ESCAPES = {'%': '%25', '.': '%2E', '$': '%24', '\x00': '%00'}
_UNESCAPES = {escaped: character for character, escaped in _ESCAPES.items()}
_SPECIAL = re.compile(r'[%.$\x00]')
_ESCAPED = re.compile(r'%(?:25|2E|24|00)')
_WELL_FORMED = re.compile(r'(?:[^%.$\x00]|%(?:25|2E|24|00))+')
_EMPTY_KEY = '%'


def encode_metadata_key(key: str) -> str:
    """The BSON field name that stores metadata key `key` (see the module docstring)."""
    if key == '':
        return _EMPTY_KEY
    return _SPECIAL.sub(lambda match: _ESCAPES[match.group()], key)


def decode_metadata_key(name: str) -> str:
    """The metadata key stored under field `name`; `ValueError` if no key encodes to it."""
    if name == _EMPTY_KEY:
        return ''
    if not _WELL_FORMED.fullmatch(name):
        raise ValueError(f'malformed metadata field name {name!r}')
    return _ESCAPED.sub(lambda match: _UNESCAPES[match.group()], name)


def _metadata_document(metadata: Mapping[str, str]) -> dict[str, str]:
    return {encode_metadata_key(key): value for key, value in metadata.items()}


def _metadata(document: Mapping[str, Any]) -> dict[str, Any]:
    stored = document.get('metadata')  # always written, `{}` included
    if not isinstance(stored, dict):
        raise ValueError(f'metadata must be an embedded document, got {type(stored).__name__}')
    return {decode_metadata_key(name): value for name, value in stored.items()}


def with_time(document: dict[str, Any], name: str, value: datetime | None) -> dict[str, Any]:
    """Add timestamp `value` to `document` as `name` (BSON date) and `name_us` (sub-millisecond micros)."""
    if value is None:
        document[name] = document[f'{name}_us'] = None
        return document
    value = value.astimezone(UTC)
    document[name] = value.replace(microsecond=value.microsecond - value.microsecond % 1000)
    document[f'{name}_us'] = value.microsecond % 1000
    return document


def _time(document: Mapping[str, Any], name: str) -> datetime | None:
    stored = document.get(name)
    if stored is None:
        return None
    micros = document.get(f'{name}_us')
    if not isinstance(stored, datetime) or isinstance(micros, bool) or not isinstance(micros, int):
        raise ValueError(f'{name} must be a date with an integer {name}_us, got {stored!r} and {micros!r}')
    if not 0 <= micros < 1000 or stored.microsecond % 1000:
        raise ValueError(f'{name} {stored!r} with {name}_us {micros!r} is not a millisecond plus micros')
    return stored.astimezone(UTC) + timedelta(microseconds=micros)


def _optional(document: dict[str, Any], **fields: str | None) -> dict[str, Any]:
    """Add the fields that are not `None` (sparse indexes leave out documents without them)."""
    document.update({name: value for name, value in fields.items() if value is not None})
    return document


def run_document(record: RunRecord, *, registration: int) -> dict[str, Any]:
    """The `runs` document: `_id` is the run id; `registration` orders runs registered at one instant."""
    document: dict[str, Any] = {
        '_id': record.run_id,
        'agent_name': record.agent_name,
        'metadata': _metadata_document(record.metadata),
    }
    _optional(document, conversation_id=record.conversation_id, parent_run_id=record.parent_run_id)
    document['registration'] = registration
    return with_time(document, 'started_at', record.started_at)


def run_from_document(document: Mapping[str, Any]) -> RunRecord:
    return RunRecord.model_validate(
        {
            'run_id': document['_id'],
            'conversation_id': document.get('conversation_id'),
            'parent_run_id': document.get('parent_run_id'),
            'agent_name': document.get('agent_name'),
            'metadata': _metadata(document),
            'started_at': _time(document, 'started_at'),
        },
        strict=True,
    )


def _stored_as_is(model: type[BaseModel], *special: str) -> tuple[str, ...]:
    """The fields of `model` a document holds unchanged: all but `special` (stored otherwise, or not at all).

    Derived from the model, so a field added to a record is stored without a change here.
    """
    return tuple(name for name in model.model_fields if name not in special)


_EVENT_FIELDS = _stored_as_is(StepEvent, 'run_id', 'timestamp', 'metadata')


def event_document(event: StepEvent, *, seq: int) -> dict[str, Any]:
    """The `events` document of the run's `seq`-th event."""
    document: dict[str, Any] = {'run_id': event.run_id, 'seq': seq}
    document.update({name: getattr(event, name) for name in _EVENT_FIELDS})
    document['metadata'] = _metadata_document(event.metadata)
    return with_time(document, 'timestamp', event.timestamp)


def event_from_document(document: Mapping[str, Any]) -> StepEvent:
    """The event; its `seq` (its place in the log, not part of the record) must be a positive integer."""
    _number(document, 'seq')
    return StepEvent.model_validate(
        {
            'run_id': document['run_id'],
            **{name: document.get(name) for name in _EVENT_FIELDS},
            'metadata': _metadata(document),
            'timestamp': _time(document, 'timestamp'),
        },
        strict=True,
    )


_SNAPSHOT_FIELDS = _stored_as_is(ContinuableSnapshot, 'run_id', 'seq', 'messages', 'timestamp')


def snapshot_document(
    snapshot: ContinuableSnapshot, *, seq: int, history_length: int, through_message: int
) -> dict[str, Any]:
    """The `snapshots` document: header fields and the history as `history_length` + `through_message`.

    Message `i` of the history is the run's message document at position `i` with the largest
    number not above `through_message`.
    """
    document: dict[str, Any] = {'run_id': snapshot.run_id, 'seq': seq}
    document.update({name: getattr(snapshot, name) for name in _SNAPSHOT_FIELDS})
    document['history_length'] = history_length
    document['through_message'] = through_message
    return with_time(document, 'timestamp', snapshot.timestamp)


def _count(document: Mapping[str, Any], name: str, *, least: int = 0) -> int:
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f'{name} must be an integer of at least {least}, got {value!r}')
    return value


def _number(document: Mapping[str, Any], name: str) -> int:
    """A per-run sequence number (`seq`, `no`): an integer from 1."""
    return _count(document, name, least=1)


def snapshot_from_document(document: Mapping[str, Any]) -> tuple[ContinuableSnapshot, int, int]:
    """The snapshot without its messages, its `history_length` and its `through_message`.

    `ValueError` also for a `history_length` its `through_message` cannot hold: message `i` is a
    document numbered at most `through_message`, and a document numbered `n` holds a position
    below `n` (`stores/_positions.plausible_position`), so a history of `L` messages needs
    `through_message >= L`. Trusting more would make a read look for a billion positions.
    """
    header = ContinuableSnapshot.model_validate(
        {
            'run_id': document['run_id'],
            'seq': _number(document, 'seq'),
            **{name: document.get(name) for name in _SNAPSHOT_FIELDS},
            'timestamp': _time(document, 'timestamp'),
            'messages': [],
        },
        strict=True,
    )
    length, through = _count(document, 'history_length'), _count(document, 'through_message')
    if length > through:
        raise ValueError(f'a history of {length} messages cannot end at message number {through}')
    return header, length, through


def tool_effect_update(record: ToolEffectRecord) -> dict[str, Any]:
    """The `$set` of the upsert: every field, except annotations the record leaves null (stored ones stay)."""
    fields: dict[str, Any] = {'tool_name': record.tool_name, 'status': record.status}
    with_time(fields, 'started_at', record.started_at)
    with_time(fields, 'ended_at', record.ended_at)
    return _optional(fields, idempotency_key=record.idempotency_key, effect_summary=record.effect_summary)


def tool_effect_from_document(document: Mapping[str, Any]) -> ToolEffectRecord:
    return ToolEffectRecord.model_validate(
        {
            'run_id': document['run_id'],
            'tool_call_id': document['tool_call_id'],
            'tool_name': document.get('tool_name'),
            'status': document.get('status'),
            'started_at': _time(document, 'started_at'),
            'ended_at': _time(document, 'ended_at'),
            'idempotency_key': document.get('idempotency_key'),
            'effect_summary': document.get('effect_summary'),
        },
        strict=True,
    )
