"""The JSON spelling of records in the file store's files.

Single-object files (`run.json`, `snapshots/<seq>.json`) are indented; log files hold one compact
JSON object per line (events and tool effects as their models dump them). Timestamps are ISO-8601
in UTC (`...Z`). Everything read back is validated by the record models, so an unknown `kind`,
`state` or `status` raises `ValueError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt

from step_persistence.records import SNAPSHOT_STATES, ContinuableSnapshot, RunRecord, SnapshotState
from step_persistence.retention import validate_max_snapshots

__all__ = [
    'HistoryRef',
    'SnapshotEntry',
    'dump_run_file',
    'dump_snapshot_file',
    'dump_snapshot_journal_line',
    'json_object',
    'load_run_file',
    'load_snapshot_file',
    'load_snapshot_journal_line',
    'natural_number',
]


def _indented(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + '\n').encode()


def json_object(data: bytes, what: str) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f'{what} must hold a JSON object, got {type(value).__name__}')
    return value


def dump_run_file(record: RunRecord, registered_ns: int) -> bytes:
    """`run.json`: the record, and the registration stamp that orders runs registered at the same instant."""
    return _indented({'run': record.model_dump(mode='json'), 'registered_ns': registered_ns})


class _RunFile(BaseModel):
    model_config = ConfigDict(extra='forbid')

    run: RunRecord
    registered_ns: StrictInt


def load_run_file(data: bytes) -> tuple[RunRecord, int]:
    """The record and registration stamp of a `run.json`; `ValueError` (a pydantic `ValidationError`)
    naming the field for anything malformed."""
    loaded = _RunFile.model_validate_json(data)
    return loaded.run, loaded.registered_ns


def natural_number(value: object, what: str) -> int:
    """`value` if it is an int >= 0; otherwise raise `ValueError` naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f'{what} must be an int >= 0, got {value!r}')
    return value


@dataclass(frozen=True)
class HistoryRef:
    """Which stored messages make up a snapshot's history, in O(1) space.

    Message `i` of the history is the last line of `messages.jsonl` for position `i` whose number
    is at most `through_message`. `checksum` covers the digests of the chosen messages and their
    positions, so a damaged or missing line makes the snapshot unreadable instead of silently
    different.
    """

    length: int
    through_message: int
    checksum: str

    def to_json(self) -> dict[str, Any]:
        return {'length': self.length, 'through_message': self.through_message, 'checksum': self.checksum}

    @classmethod
    def from_json(cls, value: object) -> HistoryRef:
        if not isinstance(value, dict):
            raise ValueError(f'a snapshot history reference must be a JSON object, got {value!r}')
        checksum = value.get('checksum')
        if not isinstance(checksum, str):
            raise ValueError(f'a snapshot history reference needs a checksum string, got {checksum!r}')
        return cls(
            length=natural_number(value.get('length'), 'history length'),
            through_message=natural_number(value.get('through_message'), 'history through_message'),
            checksum=checksum,
        )


def dump_snapshot_file(snapshot: ContinuableSnapshot, seq: int, history: HistoryRef) -> bytes:
    """`snapshots/<seq>.json`: the snapshot's fields, with a reference to its stored messages."""
    header = snapshot.model_dump(mode='json', exclude={'messages', 'seq'})
    return _indented({'seq': seq, **header, 'history': history.to_json()})


def load_snapshot_file(data: bytes) -> tuple[ContinuableSnapshot, HistoryRef]:
    """The snapshot (with no messages yet) and the reference to its messages."""
    value = json_object(data, 'snapshot file')
    history = HistoryRef.from_json(value.pop('history', None))
    return ContinuableSnapshot.model_validate({**value, 'messages': []}), history


@dataclass(frozen=True)
class SnapshotEntry:
    """One line of `snapshots.jsonl`: a saved snapshot (the line is what commits it)."""

    seq: int
    state: SnapshotState
    idempotency_key: str | None
    retain: int | None
    """The `max_snapshots_per_run` of the store that wrote the line: the retention applied after it."""


def dump_snapshot_journal_line(snapshot: ContinuableSnapshot, seq: int, retain: int | None) -> bytes:
    """The `snapshots.jsonl` line committing snapshot `seq` (step and time included for readers), and
    the retention its writer applied (`retain`, left out when the writer kept every snapshot)."""
    fields = snapshot.model_dump(mode='json', include={'state', 'step_index', 'timestamp', 'idempotency_key'})
    line = {'seq': seq, **fields} if retain is None else {'seq': seq, **fields, 'retain': retain}
    return json.dumps(line, ensure_ascii=False).encode()


def load_snapshot_journal_line(line: bytes) -> SnapshotEntry:
    """Parse a `snapshots.jsonl` line; raises `ValueError` for anything malformed."""
    value = json_object(line, 'snapshot journal line')
    seq, state, key = value.get('seq'), value.get('state'), value.get('idempotency_key')
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise ValueError(f'snapshot journal line has no valid seq: {seq!r}')
    retain = validate_max_snapshots(value.get('retain'))
    if state not in SNAPSHOT_STATES:
        raise ValueError(f'snapshot journal line has an unknown state {state!r}')
    if key is not None and not isinstance(key, str):
        raise ValueError(f'snapshot journal line has a non-string idempotency_key {key!r}')
    return SnapshotEntry(seq=seq, state=state, idempotency_key=key, retain=retain)
