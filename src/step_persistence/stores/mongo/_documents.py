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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.stores.mongo._lines import check_line, legacy_line

__all__ = [
    'StoredView',
    'decode_metadata_key',
    'encode_metadata_key',
    'event_document',
    'event_from_document',
    'run_document',
    'run_from_document',
    'snapshot_document',
    'snapshot_from_document',
    'stored_view',
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
    """The `runs` document: `_id` is the run id; `registration` orders runs registered at one instant.

    `origin` (left out when null) is `{kind, run_id, seq}`; a unique partial index on its
    `(run_id, seq)` where `kind` is `continued` admits one continuation per snapshot.
    """
    document: dict[str, Any] = {
        '_id': record.run_id,
        'agent_name': record.agent_name,
        'metadata': _metadata_document(record.metadata),
    }
    _optional(document, conversation_id=record.conversation_id, parent_run_id=record.parent_run_id)
    if record.origin is not None:
        document['origin'] = {'kind': record.origin.kind, 'run_id': record.origin.run_id, 'seq': record.origin.seq}
    document['registration'] = registration
    return with_time(document, 'started_at', record.started_at)


def _origin(document: Mapping[str, Any]) -> dict[str, Any] | None:
    if 'origin' not in document:  # also every run written before origins existed
        return None
    stored = document['origin']
    if not isinstance(stored, dict) or set(stored) != {'kind', 'run_id', 'seq'}:
        raise ValueError(f'origin must be an embedded document of kind, run_id and seq, got {stored!r}')
    return stored


def run_from_document(document: Mapping[str, Any]) -> RunRecord:
    return RunRecord.model_validate(
        {
            'run_id': document['_id'],
            'conversation_id': document.get('conversation_id'),
            'parent_run_id': document.get('parent_run_id'),
            'agent_name': document.get('agent_name'),
            'metadata': _metadata(document),
            'started_at': _time(document, 'started_at'),
            'origin': _origin(document),
        },
        strict=True,
    )


def _stored_as_is(model: type[BaseModel], *special: str) -> tuple[str, ...]:
    """The fields of `model` a document holds unchanged: all but `special` (stored otherwise, or not at all).

    Derived from the model, so a field added to a record is stored without a change here.
    """
    return tuple(name for name in model.model_fields if name not in special)


_EVENT_FIELDS = _stored_as_is(StepEvent, 'run_id', 'timestamp', 'metadata', 'model_name', 'usage')


def event_document(event: StepEvent, *, seq: int) -> dict[str, Any]:
    """The `events` document of the run's `seq`-th event.

    `model_name` and `usage` (an embedded document of its four counts) are left out when null, as in
    every event written before they existed.
    """
    document: dict[str, Any] = {'run_id': event.run_id, 'seq': seq}
    document.update({name: getattr(event, name) for name in _EVENT_FIELDS})
    document['metadata'] = _metadata_document(event.metadata)
    _optional(document, model_name=event.model_name)
    if event.usage is not None:
        document['usage'] = event.usage.model_dump()
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
            'model_name': document.get('model_name'),
            'usage': document.get('usage'),
        },
        strict=True,
    )


_SNAPSHOT_FIELDS = _stored_as_is(ContinuableSnapshot, 'run_id', 'seq', 'messages', 'timestamp')

_DIGEST = re.compile(r'[0-9a-f]{64}')


@dataclass(frozen=True, slots=True)
class StoredView:
    """Where a snapshot's history is: its view `(line, length, through)` and the digest of the whole history."""

    line: str | None
    """`None` only for an empty history, which is on no line."""
    length: int
    through: int
    history_digest: str | None
    """`ContinuableSnapshot.history_digest()`; `None` on snapshots written before it was stored."""


def snapshot_document(snapshot: ContinuableSnapshot, *, seq: int, view: StoredView) -> dict[str, Any]:
    """The `snapshots` document: header fields and the history's view (`line`, `history_length`,
    `through_message`) with its `history_digest`.

    Message `i` of the history is the newest message document of the line at position `i`
    numbered at most `through_message`, or, when the line has none there, that of its base.
    """
    document: dict[str, Any] = {'run_id': snapshot.run_id, 'seq': seq}
    document.update({name: getattr(snapshot, name) for name in _SNAPSHOT_FIELDS})
    document['line'] = view.line
    document['history_length'] = view.length
    document['through_message'] = view.through
    document['history_digest'] = view.history_digest
    return with_time(document, 'timestamp', snapshot.timestamp)


def _count(document: Mapping[str, Any], name: str, *, least: int = 0) -> int:
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f'{name} must be an integer of at least {least}, got {value!r}')
    return value


def _number(document: Mapping[str, Any], name: str) -> int:
    """A per-run sequence number (`seq`, `no`): an integer from 1."""
    return _count(document, name, least=1)


def stored_view(document: Mapping[str, Any]) -> StoredView:
    """The view a snapshot document names; `ValueError` if damaged.

    A document without `line` (nor `history_digest`) was written before lines existed: its view
    is on its run's legacy line. Whether the view's segments can hold `history_length` messages
    is checked as it is read (`_messages.py`), so a damaged length allocates nothing.
    """
    length, through = _count(document, 'history_length'), _count(document, 'through_message')
    if 'line' not in document:
        run_id = document.get('run_id')
        if not isinstance(run_id, str):
            raise ValueError(f'run_id must be a string, got {run_id!r}')
        line: str | None = legacy_line(run_id)
    elif document['line'] is None and length == 0:
        line = None
    else:
        line = check_line(document['line'])
    digest = document.get('history_digest')
    if 'line' in document and not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
        raise ValueError(f'history_digest must be 64 lowercase hex digits, got {digest!r}')
    return StoredView(line=line, length=length, through=through, history_digest=digest)


def snapshot_from_document(document: Mapping[str, Any]) -> tuple[ContinuableSnapshot, StoredView]:
    """The snapshot without its messages, and the view its history is in (`stored_view`)."""
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
    return header, stored_view(document)


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
