"""Records to table rows and back; reading validates, so a bad stored value raises `ValueError`.

The columns a record is read from decode their values through `types.Tolerant`: a value its type
cannot decode (damaged behind the store's back) arrives as `types.Unreadable`, and building the
record raises `ValueError` naming the column, so the caller skips that row alone. On PostgreSQL a
few values fail inside the driver instead, for the whole query; `fetch` then reads it again
through `careful`, in a form that cannot fail there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Text, cast, extract, type_coerce
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from step_persistence._reading import logger
from step_persistence.records import ContinuableSnapshot, RunOrigin, RunRecord, StepEvent, TokenUsage, ToolEffectRecord
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.schema import events, runs, snapshots, tool_effects
from step_persistence.stores.sql.types import DateTimeUTC, EpochInstant, JSONDocument, JSONText, Tolerant, Unreadable

__all__ = [
    'EVENT_COLUMNS',
    'EVENT_FIELDS',
    'MAX_INDEXED_BYTES',
    'RUN_COLUMNS',
    'RUN_KEY',
    'SEQ_RANGE',
    'SNAPSHOT_HEADER_COLUMNS',
    'STEP_INDEX_RANGE',
    'TOOL_EFFECT_COLUMNS',
    'TOOL_EFFECT_FIELDS',
    'StoredHistory',
    'careful',
    'event_from_row',
    'event_values',
    'fetch',
    'readable',
    'require_readable',
    'require_storable',
    'run_from_row',
    'run_values',
    'snapshot_header_from_row',
    'snapshot_values',
    'tool_effect_from_row',
    'tool_effect_values',
    'view_of',
]

MAX_INDEXED_BYTES = 1024
"""The most UTF-8 bytes of an id or key the store indexes (`run_id`, `conversation_id`, `parent_run_id`,
`tool_call_id`, idempotency keys), on both dialects alike. A PostgreSQL btree entry holds at most 2704
bytes (after compression, which random text defeats), and the widest index holds two such values."""

_INDEXED_FIELDS: dict[type, tuple[str, ...]] = {
    RunRecord: ('run_id', 'conversation_id', 'parent_run_id', 'agent_name'),
    StepEvent: ('run_id', 'idempotency_key'),
    ContinuableSnapshot: ('run_id', 'idempotency_key'),
    ToolEffectRecord: ('run_id', 'tool_call_id'),
}


STEP_INDEX_RANGE = range(-(2**31), 2**31)
"""The step indexes the store keeps (an `INTEGER` column: PostgreSQL's is 32 bits), on both dialects alike."""

SEQ_RANGE = range(-(2**63), 2**63)
"""The snapshot sequence numbers an origin may name (a `BIGINT` column)."""


def require_storable(record: RunRecord | StepEvent | ContinuableSnapshot | ToolEffectRecord) -> None:
    """Raise `ValueError` if an indexed id or key of `record` (its origin's run id included) is longer than
    `MAX_INDEXED_BYTES` in UTF-8, its step index is outside `STEP_INDEX_RANGE`, or its origin's seq outside
    `SEQ_RANGE`.

    Checked before anything is written; a string of at most a quarter as many characters needs no
    encoding to be known short enough.
    """
    if isinstance(record, StepEvent | ContinuableSnapshot) and record.step_index not in STEP_INDEX_RANGE:
        raise ValueError(
            f'step_index {record.step_index} is outside the range the SQL store keeps '
            f'({STEP_INDEX_RANGE.start} to {STEP_INDEX_RANGE.stop - 1}): nothing was written'
        )
    values = [(name, getattr(record, name)) for name in _INDEXED_FIELDS[type(record)]]
    if isinstance(record, RunRecord) and record.origin is not None:
        values.append(('origin.run_id', record.origin.run_id))
        if record.origin.seq not in SEQ_RANGE:
            raise ValueError(
                f'origin.seq {record.origin.seq} is outside the range the SQL store keeps '
                f'({SEQ_RANGE.start} to {SEQ_RANGE.stop - 1}): nothing was written'
            )
    for name, value in values:
        if value is not None and len(value) > MAX_INDEXED_BYTES // 4:
            size = len(value.encode('utf-8', 'surrogatepass'))
            if size > MAX_INDEXED_BYTES:
                raise ValueError(
                    f'{name} is {size} bytes long in UTF-8; the SQL store indexes it and takes at most '
                    f'{MAX_INDEXED_BYTES}: nothing was written'
                )


RUN_KEY = 'run'
"""The parameter naming the run of an event, tool effect or snapshot key (see `statements.py`)."""

_RUN_FIELDS = ('run_id', 'conversation_id', 'parent_run_id', 'agent_name', 'metadata', 'started_at')
_ORIGIN_FIELDS = ('origin_kind', 'origin_run_id', 'origin_seq')
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
    'model_name',
    'input_tokens',
    'output_tokens',
    'cache_read_tokens',
    'cache_write_tokens',
)
"""The `events` columns an event is stored in: its fields, its `usage` spread over `_USAGE_COLUMNS`."""
_USAGE_COLUMNS = tuple(TokenUsage.model_fields)
"""The columns of `StepEvent.usage`, named as its fields: all `NULL` (no usage) or none."""
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

_CAREFUL: dict[ColumnElement[Any], ColumnElement[Any]] = {}
"""Each readable column whose value the PostgreSQL driver decodes itself -> the same value read carefully."""


def readable(column: ColumnElement[Any], *, name: str | None = None) -> ColumnElement[Any]:
    """`column` to select for a record (labelled `name`, by default its own): a value its type cannot
    decode reads as `Unreadable`, not an error.

    Only types that convert values on the way out are wrapped (instants and JSON documents); a
    column of any other type is returned as it is. Call it once per column, when a module builds its
    statements: each wrapped column is remembered (for `careful`).
    """
    column_type = column.type
    if not isinstance(column_type, DateTimeUTC | JSON | JSONDocument):
        return column if name is None else column.label(name)
    name = column.key if name is None else name
    wrapped = type_coerce(column, Tolerant(column_type)).label(name)
    if isinstance(column_type, DateTimeUTC):
        _CAREFUL[wrapped] = type_coerce(extract('epoch', column), Tolerant(EpochInstant())).label(name)
    else:
        _CAREFUL[wrapped] = type_coerce(cast(column, Text), Tolerant(JSONText())).label(name)
    return wrapped


def careful(statement: Select[Any]) -> Select[Any]:
    """`statement` with every readable instant read as seconds since the epoch and every JSON document as
    text (PostgreSQL), so that the driver decodes neither and a damaged value makes only its row unreadable."""
    columns = [_CAREFUL.get(column, column) for column in statement.selected_columns]
    return statement.with_only_columns(*columns, maintain_column_froms=True)


_DECODING_ERRORS = (ArithmeticError, RecursionError, ValueError)
"""What asyncpg raises, for a whole query, for a value it cannot decode: an instant beyond Python's
years or infinite (`OverflowError`), JSON nested deeper than Python decodes (`RecursionError`)."""

_SQLITE_UNDECODABLE = 'Could not decode to UTF-8'
"""What Python's `sqlite3` raises, for a whole query, for a text value that is not UTF-8."""


def fetch(transaction: Transaction, statement: Select[Any], parameters: Mapping[str, Any] | None = None) -> list[Any]:
    """Every row of `statement`, even when the driver cannot decode a stored value (damaged behind the
    store's back), which it would otherwise raise for the whole query.

    Read again, then: on PostgreSQL through `careful`; on SQLite with text that is not UTF-8 read as
    `Unreadable` (the row's record then fails to build, alone).
    """
    try:
        return list(transaction.execute(statement, parameters))
    except _DECODING_ERRORS as error:
        if transaction.connection.dialect.name != 'postgresql':
            raise
        logger.warning('reading again value by value: the database driver could not decode a stored value (%r)', error)
        return list(transaction.execute(careful(statement), parameters))
    except DBAPIError as error:
        if transaction.connection.dialect.name != 'sqlite' or _SQLITE_UNDECODABLE not in str(error.orig):
            raise
        logger.warning('reading again value by value: a stored text is not UTF-8 (%s)', error.orig)
        driver: Any = transaction.connection.connection.driver_connection  # sqlite3 or aiosqlite: both take it
        previous = driver.text_factory
        driver.text_factory = _text_or_unreadable
        try:
            return list(transaction.execute(statement, parameters))
        finally:
            driver.text_factory = previous


def _text_or_unreadable(data: bytes) -> str | Unreadable:
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError as error:
        return Unreadable(error)


def require_readable(row: Mapping[str, Any], names: tuple[str, ...]) -> None:
    """Raise `ValueError` naming the first of `names` whose value in `row` could not be decoded."""
    for name in names:
        value = row[name]
        if type(value) is Unreadable:
            raise ValueError(f'unreadable {name}: {value.error!r}')


RUN_COLUMNS: tuple[ColumnElement[Any], ...] = tuple(readable(runs.c[name]) for name in (*_RUN_FIELDS, *_ORIGIN_FIELDS))
EVENT_COLUMNS: tuple[ColumnElement[Any], ...] = tuple(readable(events.c[name]) for name in EVENT_FIELDS)
TOOL_EFFECT_COLUMNS: tuple[ColumnElement[Any], ...] = tuple(
    readable(tool_effects.c[name]) for name in TOOL_EFFECT_FIELDS
)
SNAPSHOT_HEADER_COLUMNS: tuple[ColumnElement[Any], ...] = (
    *(readable(snapshots.c[name]) for name in _SNAPSHOT_FIELDS),
    snapshots.c.line_id,
    snapshots.c.history_length,
    snapshots.c.through_message,
    snapshots.c.history_digest,
)
"""A snapshot row: its fields and its view of a history line."""


@dataclass(frozen=True)
class StoredHistory:
    """A snapshot's view: for each position below `length`, the newest row of `line` numbered at most
    `through_message`, or else the line's base view (`stores/_positions.py`). `line` is `None` only for
    the empty history."""

    line: int | None
    length: int
    through_message: int
    history_digest: str | None = None
    """The digest of the history's message digests (`_history.history_digest`; `None`: not stored, for
    snapshots saved before revision 0005), against which a view's rows are checked when read."""


def run_values(record: RunRecord, *, origin_kind: str | None = None) -> dict[str, Any]:
    """The run's row; `origin_kind` stores its origin under another kind (a second continuation: `forked`)."""
    values = {name: getattr(record, name) for name in _RUN_FIELDS}
    origin = record.origin
    values['origin_kind'] = None if origin is None else origin_kind or origin.kind
    values['origin_run_id'] = None if origin is None else origin.run_id
    values['origin_seq'] = None if origin is None else origin.seq
    return values


def run_from_row(row: Mapping[str, Any]) -> RunRecord:
    """The record of a `runs` row (read with `RUN_COLUMNS`); an origin stored in part is damage."""
    require_readable(row, _RUN_FIELDS)
    fields: dict[str, Any] = {name: row[name] for name in _RUN_FIELDS}
    kind, run_id, seq = (row[name] for name in _ORIGIN_FIELDS)
    if (kind, run_id, seq) != (None, None, None):
        if not _is_int(seq):
            raise ValueError(f'malformed origin: kind {kind!r}, run {run_id!r}, seq {seq!r}')
        fields['origin'] = RunOrigin.model_validate({'kind': kind, 'run_id': run_id, 'seq': seq}, strict=True)
    return RunRecord.model_validate(fields)


def event_values(event: StepEvent) -> dict[str, Any]:
    """The parameters of `WriteStatements.append_event`: the event's columns, its run as `run`."""
    usage = {} if event.usage is None else event.usage.model_dump()
    return {
        RUN_KEY if name == 'run_id' else name: usage.get(name) if name in _USAGE_COLUMNS else getattr(event, name)
        for name in EVENT_FIELDS
    }


def event_from_row(row: Mapping[str, Any]) -> StepEvent:
    """The event of an `events` row (read with `EVENT_COLUMNS`); a usage stored in part is damage."""
    require_readable(row, EVENT_FIELDS)
    fields: dict[str, Any] = {name: row[name] for name in EVENT_FIELDS if name not in _USAGE_COLUMNS}
    usage = {name: row[name] for name in _USAGE_COLUMNS}
    if any(value is not None for value in usage.values()):
        fields['usage'] = usage
    return StepEvent.model_validate(fields)


def tool_effect_values(record: ToolEffectRecord) -> dict[str, Any]:
    """The parameters of `WriteStatements.record_tool_effect`: the record's fields, its run as `run`."""
    return {RUN_KEY if name == 'run_id' else name: getattr(record, name) for name in TOOL_EFFECT_FIELDS}


def tool_effect_from_row(row: Mapping[str, Any]) -> ToolEffectRecord:
    require_readable(row, TOOL_EFFECT_FIELDS)
    return ToolEffectRecord.model_validate({name: row[name] for name in TOOL_EFFECT_FIELDS})


def snapshot_values(snapshot: ContinuableSnapshot, *, seq: int, history: StoredHistory) -> dict[str, Any]:
    values = {name: getattr(snapshot, name) for name in _SNAPSHOT_FIELDS if name != 'seq'}
    return {
        **values,
        'seq': seq,
        'line_id': history.line,
        'history_length': history.length,
        'through_message': history.through_message,
        'history_digest': history.history_digest,
    }


def snapshot_header_from_row(row: Mapping[str, Any]) -> tuple[ContinuableSnapshot, StoredHistory]:
    """The snapshot without messages, and its view; `ValueError` for a malformed row.

    Only the empty history has no line. (Whether the length fits the line's rows and base is
    checked when the view is read: `views.py`.)
    """
    require_readable(row, _SNAPSHOT_FIELDS)
    header = ContinuableSnapshot.model_validate({**{name: row[name] for name in _SNAPSHOT_FIELDS}, 'messages': []})
    return header, view_of(row['line_id'], row['history_length'], row['through_message'], row['history_digest'])


def view_of(line: object, length: object, through: object, history_digest: object) -> StoredHistory:
    """The view a snapshot row stores (`line_id`, `history_length`, `through_message`, `history_digest`);
    `ValueError` for values no save writes (only the empty history may have no line)."""
    if not (_is_int(length) and _is_int(through) and length >= 0 and through >= 0):  # type: ignore[operator]
        raise ValueError(f'malformed history reference: length {length!r}, through message {through!r}')
    if not (_is_int(line) if line is not None else length == 0):
        raise ValueError(f'malformed history reference: line {line!r} for a history of {length} messages')
    if history_digest is not None and not isinstance(history_digest, str):
        raise ValueError(f'malformed history digest {history_digest!r}')
    return StoredHistory(line=line, length=length, through_message=through, history_digest=history_digest)  # type: ignore[arg-type]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
