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

from step_persistence._history import unpack_refs
from step_persistence.records import SNAPSHOT_STATES, ContinuableSnapshot, RunRecord, SnapshotState

__all__ = [
    'SnapshotEntry',
    'dump_run_file',
    'dump_snapshot_file',
    'dump_snapshot_journal_line',
    'json_object',
    'load_run_file',
    'load_snapshot_file',
    'load_snapshot_journal_line',
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


def load_run_file(data: bytes) -> tuple[RunRecord, int]:
    """The record and registration stamp of a `run.json`."""
    value = json_object(data, 'run.json')
    registered_ns = value.get('registered_ns')
    if not isinstance(registered_ns, int):
        raise ValueError(f'run.json has no integer registered_ns: {registered_ns!r}')
    return RunRecord.model_validate(value.get('run')), registered_ns


def dump_snapshot_file(snapshot: ContinuableSnapshot, seq: int, message_ranges: list[list[int]]) -> bytes:
    """`snapshots/<seq>.json`: the snapshot's fields, with its messages as ranges of message numbers."""
    header = snapshot.model_dump(mode='json', exclude={'messages', 'seq'})
    return _indented({'seq': seq, **header, 'message_ranges': message_ranges})


def load_snapshot_file(data: bytes) -> tuple[ContinuableSnapshot, list[int]]:
    """The snapshot (with no messages yet) and the numbers of its messages, in history order."""
    value = json_object(data, 'snapshot file')
    numbers = unpack_refs(value.pop('message_ranges', None))
    return ContinuableSnapshot.model_validate({**value, 'messages': []}), numbers


@dataclass(frozen=True)
class SnapshotEntry:
    """One line of `snapshots.jsonl`: a saved snapshot (the line is what commits it)."""

    seq: int
    state: SnapshotState
    idempotency_key: str | None


def dump_snapshot_journal_line(snapshot: ContinuableSnapshot, seq: int) -> bytes:
    """The `snapshots.jsonl` line committing snapshot `seq` (step and time included for readers)."""
    fields = snapshot.model_dump(mode='json', include={'state', 'step_index', 'timestamp', 'idempotency_key'})
    return json.dumps({'seq': seq, **fields}, ensure_ascii=False).encode()


def load_snapshot_journal_line(line: bytes) -> SnapshotEntry:
    """Parse a `snapshots.jsonl` line; raises `ValueError` for anything malformed."""
    value = json_object(line, 'snapshot journal line')
    seq, state, key = value.get('seq'), value.get('state'), value.get('idempotency_key')
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise ValueError(f'snapshot journal line has no valid seq: {seq!r}')
    if state not in SNAPSHOT_STATES:
        raise ValueError(f'snapshot journal line has an unknown state {state!r}')
    if key is not None and not isinstance(key, str):
        raise ValueError(f'snapshot journal line has a non-string idempotency_key {key!r}')
    return SnapshotEntry(seq=seq, state=state, idempotency_key=key)
