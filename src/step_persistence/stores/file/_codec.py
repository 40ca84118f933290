"""The JSON spelling of records in the file store's files.

Single-object files (`snapshots/<seq>.json`, `line.json`; `run.json` is spelled in `_run_files`)
are indented; log files hold one compact JSON object per line (events and tool effects as their
models dump them). Timestamps are ISO-8601 in UTC (`...Z`). Everything read back is validated by
the record models, so an unknown `kind`, `state` or `status` raises `ValueError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from step_persistence.records import SNAPSHOT_STATES, ContinuableSnapshot, SnapshotState
from step_persistence.retention import validate_max_snapshots
from step_persistence.stores._positions import LineBase
from step_persistence.stores.file._layout import require_line_id

__all__ = [
    'LegacyHistory',
    'LineView',
    'SnapshotEntry',
    'SnapshotHistory',
    'dump_conversation_file',
    'dump_line_file',
    'dump_snapshot_file',
    'dump_snapshot_journal_line',
    'indented',
    'json_object',
    'load_conversation_file',
    'load_line_file',
    'load_snapshot_file',
    'load_snapshot_journal_line',
    'natural_number',
]


def indented(value: Any) -> bytes:
    """The spelling of single-object files: indented JSON, UTF-8 text kept as it is, a final newline."""
    return (json.dumps(value, indent=2, ensure_ascii=False) + '\n').encode()


def json_object(data: bytes, what: str) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f'{what} must hold a JSON object, got {type(value).__name__}')
    return value


def natural_number(value: object, what: str) -> int:
    """`value` if it is an int >= 0; otherwise raise `ValueError` naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f'{what} must be an int >= 0, got {value!r}')
    return value


@dataclass(frozen=True)
class LineView:
    """A snapshot's history as a view of a history line (see `step_persistence.stores._positions`).

    Message `i` is the newest row of `line` at position `i` numbered at most `through`, or, for a
    position without one below the line's base length, the message at `i` of the base's view.
    `digest` is the history's `history_digest`: by it a kept history is found (`find_snapshot`),
    and the messages a read assembles are checked against it, so a damaged or missing message
    line makes the snapshot unreadable instead of silently different.
    """

    line: str
    length: int
    through: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {'line': self.line, 'length': self.length, 'through_message': self.through, 'digest': self.digest}

    @classmethod
    def from_json(cls, value: object) -> LineView:
        if not isinstance(value, dict):
            raise ValueError(f'a snapshot view must be a JSON object, got {value!r}')
        digest = value.get('digest')
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise ValueError(f'a snapshot view needs a history digest, got {digest!r}')
        return cls(
            line=require_line_id(value.get('line')),
            length=natural_number(value.get('length'), 'history length'),
            through=natural_number(value.get('through_message'), 'history through_message'),
            digest=digest,
        )


_DIGEST = re.compile(r'[0-9a-f]{64}')


@dataclass(frozen=True)
class LegacyHistory:
    """The history of a snapshot written before history lines: a view of its run's own `messages.jsonl`.

    Message `i` is the last line for position `i` numbered at most `through_message`; `checksum`
    (`history_checksum`) covers the chosen messages' positions and digests.
    """

    length: int
    through_message: int
    checksum: str

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> LegacyHistory:
        checksum = value.get('checksum')
        if not isinstance(checksum, str):
            raise ValueError(f'a snapshot history reference needs a checksum string, got {checksum!r}')
        return cls(
            length=natural_number(value.get('length'), 'history length'),
            through_message=natural_number(value.get('through_message'), 'history through_message'),
            checksum=checksum,
        )


SnapshotHistory = LineView | LegacyHistory


def _history_from_json(value: object) -> SnapshotHistory:
    if not isinstance(value, dict):
        raise ValueError(f'a snapshot history reference must be a JSON object, got {value!r}')
    return LineView.from_json(value) if 'line' in value else LegacyHistory.from_json(value)


def dump_snapshot_file(snapshot: ContinuableSnapshot, seq: int, view: LineView) -> bytes:
    """`snapshots/<seq>.json`: the snapshot's fields, with the view of its stored messages."""
    header = snapshot.model_dump(mode='json', exclude={'messages', 'seq'})
    return indented({'seq': seq, **header, 'history': view.to_json()})


def load_snapshot_file(data: bytes) -> tuple[ContinuableSnapshot, SnapshotHistory]:
    """The snapshot (with no messages yet) and where its messages are."""
    value = json_object(data, 'snapshot file')
    history = _history_from_json(value.pop('history', None))
    return ContinuableSnapshot.model_validate({**value, 'messages': []}), history


@dataclass(frozen=True)
class SnapshotEntry:
    """One line of `snapshots.jsonl`: a saved snapshot (the line is what commits it)."""

    seq: int
    state: SnapshotState
    idempotency_key: str | None
    retain: int | None
    """The `max_snapshots_per_run` of the store that wrote the line: the retention applied after it."""
    view: LineView | None
    """The snapshot's view (`None`: a snapshot written before history lines, in its run's own messages)."""


def dump_snapshot_journal_line(snapshot: ContinuableSnapshot, seq: int, retain: int | None, view: LineView) -> bytes:
    """The `snapshots.jsonl` line committing snapshot `seq` (step and time included for readers), the
    retention its writer applied (`retain`, left out when the writer kept every snapshot) and its
    view (what reclaiming and `find_snapshot` read, without the snapshot's file)."""
    fields = snapshot.model_dump(mode='json', include={'state', 'step_index', 'timestamp', 'idempotency_key'})
    line = {'seq': seq, **fields} if retain is None else {'seq': seq, **fields, 'retain': retain}
    return json.dumps({**line, 'view': view.to_json()}, ensure_ascii=False).encode()


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
    view = LineView.from_json(value['view']) if 'view' in value else None
    return SnapshotEntry(seq=seq, state=state, idempotency_key=key, retain=retain, view=view)


def dump_line_file(base: LineBase | None) -> bytes:
    """`line.json`: the view a line branches from (`null`: it starts empty)."""
    value = None if base is None else {'line': base.line, 'length': base.length, 'through_message': base.through}
    return indented({'base': value})


def load_line_file(data: bytes) -> LineBase | None:
    """The base a `line.json` names; `ValueError` for anything malformed."""
    value = json_object(data, 'line file')
    if 'base' not in value:
        raise ValueError('line file has no base')
    base = value['base']
    if base is None:
        return None
    if not isinstance(base, dict):
        raise ValueError(f'a line base must be a JSON object or null, got {base!r}')
    return LineBase(
        line=require_line_id(base.get('line')),
        length=natural_number(base.get('length'), 'base length'),
        through=natural_number(base.get('through_message'), 'base through_message'),
    )


def dump_conversation_file(conversation_id: str) -> bytes:
    """`conversation.json`: the id a conversation's directory (named by its hash) stands for."""
    return indented({'conversation_id': conversation_id})


def load_conversation_file(data: bytes) -> str:
    value = json_object(data, 'conversation file').get('conversation_id')
    if not isinstance(value, str):
        raise ValueError(f'conversation file has no conversation_id string: {value!r}')
    return value
