"""PostgreSQL: a flush of one run as one statement, which writes all of it or nothing.

A flush at an agent step (a tool call's start; a tool cycle's completion with its snapshot) is a
handful of rows of one run. In the transaction of `snapshot_saves.py` they cost a `BEGIN`, one
round trip per statement and a `COMMIT`. Here the same writes are one data-modifying `WITH`
statement of a fixed text (the rows of each table travel as one JSON document, read with
`json_to_recordset`, so that the statement is prepared once per connection whatever the number of
rows, and its values are encoded in one `json.dumps` per table), which PostgreSQL runs as its own transaction
when the connection is in autocommit (`Database.run(..., one_statement=True)`): one round trip,
and durable when it returns. In a caller's transaction it is one statement of that transaction.

Every write of the statement is gated on the checks the transaction would make first, so that a
statement whose checks fail writes nothing and says so (`Outcome.applied` false); the caller then
writes the flush the long way, which handles every such case (a run not stored, a repeated
snapshot key, a head that is stale, a snapshot counter damaged below zero, which it refuses).
`FLUSH_EVENTS` (tool effects and events) writes only if the run is stored; `FLUSH_SNAPSHOT` (the
same, and one snapshot) only if the run is the registration of the head the save builds on
(`incarnation`; its row is locked first, as a transaction's `UPDATE runs` does, so that writers of
one run take turns there before locking anything else), the head's anchor is stored (then locked
`FOR KEY SHARE` as in `heads.anchor_exists`) and the snapshot's key, if any, is claimed by this
statement. Then, as `snapshot_saves.py` does in several statements: the run's next sequence number is taken,
the planned message rows go on the head's line if nobody appended there since (else on a new line
branching from the kept part of the head's view, renumbered from 1), the snapshot row is inserted,
and with `max_snapshots_per_run` the snapshots retention no longer keeps are deleted (the newest
`keep - 1` before this one, and the newest `complete` one unless this one is). The statement sees
the snapshots as they were when it began: a save of the same run committed while it waited for the
run's counter is not among them, so the statement says so (`Outcome.saw_concurrent_save`) and the
caller applies retention again in a transaction of its own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.sql.selectable import CTE
from sqlalchemy.types import TypeEngine

from step_persistence.records import ContinuableSnapshot, StepEvent, ToolEffectRecord, require_utc
from step_persistence.stores._media import PackedMessage
from step_persistence.stores._positions import NumberedRow
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.rows import RUN_KEY
from step_persistence.stores.sql.schema import (
    events,
    history_lines,
    messages,
    runs,
    snapshot_keys,
    snapshots,
    tool_effects,
)

__all__ = [
    'Outcome',
    'events_parameters',
    'flush_statements',
    'message_parameters',
    'snapshot_parameters',
    'tool_effect_merge',
]

_EVENT_FIELDS = tuple(name for name in rows.EVENT_FIELDS if name != 'run_id')
_EFFECT_FIELDS = tuple(name for name in rows.TOOL_EFFECT_FIELDS if name != 'run_id')
_MESSAGE_FIELDS = ('no', 'position', 'digest', 'body', 'externalized')


def tool_effect_merge(excluded: Any, tool_effects: Table) -> dict[str, Any]:
    """The columns a later ledger record of a stored call sets (`ON CONFLICT DO UPDATE`): the new status
    and times, and the idempotency key and effect summary unless the new record has none."""
    return {
        'tool_name': excluded.tool_name,
        'status': excluded.status,
        'started_at': excluded.started_at,
        'ended_at': excluded.ended_at,
        'idempotency_key': func.coalesce(excluded.idempotency_key, tool_effects.c.idempotency_key),
        'effect_summary': func.coalesce(excluded.effect_summary, tool_effects.c.effect_summary),
    }


def _param(name: str, type_: TypeEngine[Any]) -> ColumnElement[Any]:
    """A bound value cast to its type (so that no driver has to guess the type of a `NULL` or an array).

    No parameter is named like a column of a table the statement updates: SQLAlchemy would add that
    column to the `UPDATE`'s `SET` clause (the names of the parameters given are its column keys)."""
    return cast(bindparam(name, type_=type_), type_)


def _row_type(column: Column[Any]) -> TypeEngine[Any]:
    """The type a column's values take in the rows' JSON document: an event's metadata as the `JSONB` object it
    is, a message body as its text (cast to `JSON` by `_value`: kept exactly as written), anything else as the
    column's own type."""
    from sqlalchemy.dialects.postgresql import JSONB

    if column is events.c.metadata:
        return JSONB()
    return Text() if column is messages.c.body else column.type


def _rows(prefix: str, table: Table, names: Sequence[str], *, ordinal: bool = False) -> Any:
    """`json_to_recordset(CAST($prefix_rows AS JSON)) AS prefix(name type, ...)`: one row per object of the JSON
    array, its keys the column names (with `ordinal`, also the row's index in the array, `ordinal`)."""
    columns = [column(name, _row_type(table.c[name])) for name in names]
    if ordinal:
        columns.append(column('ordinal', Integer()))
    document = cast(_param(f'{prefix}_rows', Text()), JSON())
    return func.json_to_recordset(document).table_valued(*columns).render_derived(name=prefix, with_types=True)


def _value(source: Any, table: Table, name: str) -> ColumnElement[Any]:
    """Column `name` of a row of the document, as its table's column takes it (a message body's text as `JSON`)."""
    value: ColumnElement[Any] = source.c[name]
    return cast(value, JSON()) if table.c[name] is messages.c.body else value


def _effects(run: ColumnElement[Any], gate: CTE) -> CTE:
    """The tool-effect upserts of the flush (as `WriteStatements.record_tool_effect`), if `gate` has a row."""
    from sqlalchemy.dialects.postgresql import insert as postgres_insert

    new = _rows('effect', tool_effects, _EFFECT_FIELDS)
    source = select(run, *(_value(new, tool_effects, name) for name in _EFFECT_FIELDS)).where(exists(select(gate.c.id)))
    upsert = postgres_insert(tool_effects).from_select(list(rows.TOOL_EFFECT_FIELDS), source)
    excluded = upsert.excluded
    return (
        upsert.on_conflict_do_update(
            index_elements=[tool_effects.c.run_id, tool_effects.c.tool_call_id],
            set_=tool_effect_merge(excluded, tool_effects),
        )
        .returning(tool_effects.c.tool_call_id)
        .cte('recorded')
    )


def _events(run: ColumnElement[Any], gate: CTE) -> CTE:
    """The events of the flush in order (as `WriteStatements.append_event`), if `gate` has a row."""
    from sqlalchemy.dialects.postgresql import insert as postgres_insert

    new = _rows('event', events, _EVENT_FIELDS, ordinal=True)
    source = (
        select(run, *(_value(new, events, name) for name in _EVENT_FIELDS))
        .where(exists(select(gate.c.id)))
        .order_by(new.c.ordinal)
    )
    return (
        postgres_insert(events)
        .from_select(list(rows.EVENT_FIELDS), source)
        .on_conflict_do_nothing(
            index_elements=[events.c.run_id, events.c.idempotency_key],
            index_where=events.c.idempotency_key.is_not(None),
        )
        .returning(events.c.id)
        .cte('appended')
    )


def _count(cte: CTE) -> ColumnElement[Any]:
    return select(func.count()).select_from(cte).scalar_subquery()


def _flush_events() -> Select[Any]:
    run = _param(RUN_KEY, String())
    registered = select(runs.c.id).where(runs.c.run_id == run).cte('registered')
    recorded, appended = _effects(run, registered), _events(run, registered)
    return select(
        select(registered.c.id).scalar_subquery(),
        cast(null(), BigInteger),
        _count(recorded),
        _count(appended),
        cast(null(), BigInteger),
        cast(null(), BigInteger),
    ).add_cte(registered, recorded, appended)


def _flush_snapshot() -> Select[Any]:
    from sqlalchemy.dialects.postgresql import insert as postgres_insert

    run = _param(RUN_KEY, String())
    incarnation = _param('incarnation', BigInteger())
    key = _param('snapshot_key', String())
    anchor_seq = _param('anchor_seq', BigInteger())
    line, through, added = _param('line', BigInteger()), _param('through', BigInteger()), _param('added', BigInteger())
    # The run's row is locked first, as every other save of the run does (`allocate_snapshot`, then the
    # anchor): a save that locked the anchor before waiting for the run's row would deadlock with one
    # holding the row and pruning that anchor.
    locked = (
        select(runs.c.id)
        .where(runs.c.run_id == run, runs.c.id == incarnation)
        .with_for_update(key_share=True)
        .cte('locked')
    )
    anchor = (
        select(snapshots.c.seq)
        .where(
            snapshots.c.run_id == _param('anchor_run', String()),
            snapshots.c.seq == anchor_seq,
            exists(select(locked.c.id)),
        )
        .with_for_update(read=True, key_share=True)
        .cte('anchor')
    )
    registration = (
        select(locked.c.id).where(or_(anchor_seq.is_(None), exists(select(anchor.c.seq)))).cte('registration')
    )
    claimed = (
        postgres_insert(snapshot_keys)
        .from_select(
            ['run_id', 'idempotency_key'], select(run, key).where(key.is_not(None), exists(select(registration.c.id)))
        )
        .on_conflict_do_nothing(index_elements=[snapshot_keys.c.run_id, snapshot_keys.c.idempotency_key])
        .returning(snapshot_keys.c.run_id)
        .cte('claimed')
    )
    allocated = (
        update(runs)
        .where(
            runs.c.run_id == run,
            runs.c.id == incarnation,
            runs.c.last_snapshot_seq >= -1,  # else the number taken is no count: the transaction refuses the save
            exists(select(registration.c.id)),
            or_(key.is_(None), exists(select(claimed.c.run_id))),
        )
        .values(last_snapshot_seq=runs.c.last_snapshot_seq + 1)
        .returning(runs.c.id, runs.c.last_snapshot_seq)
        .cte('allocated')
    )
    taken = (
        update(history_lines)
        .where(
            history_lines.c.id == line,
            history_lines.c.last_message_no == through,
            added > 0,
            exists(select(allocated.c.id)),
        )
        .values(last_message_no=history_lines.c.last_message_no + added)
        .returning(history_lines.c.id)
        .cte('taken')
    )
    branched = (
        postgres_insert(history_lines)
        .from_select(
            ['last_message_no', 'base_line_id', 'base_length', 'base_through'],
            select(
                added,
                _param('branch_line', BigInteger()),
                _param('branch_length', Integer()),
                _param('branch_through', BigInteger()),
            ).where(added > 0, exists(select(allocated.c.id)), ~exists(select(taken.c.id))),
        )
        .returning(history_lines.c.id)
        .cte('branched')
    )
    is_branch = exists(select(branched.c.id))
    placed = (
        select(
            func.coalesce(select(taken.c.id).scalar_subquery(), select(branched.c.id).scalar_subquery(), line).label(
                'line_id'
            ),
            case((is_branch, added), else_=through + added).label('through'),
            case((is_branch, through), else_=0).label('shift'),
        )
        .where(exists(select(allocated.c.id)))
        .cte('placed')
    )
    new = _rows('message', messages, _MESSAGE_FIELDS)
    stored = (
        postgres_insert(messages)
        .from_select(
            ['line_id', 'no', 'position', 'digest', 'body', 'externalized'],
            select(
                placed.c.line_id,
                new.c.no - placed.c.shift,
                new.c.position,
                new.c.digest,
                _value(new, messages, 'body'),
                new.c.externalized,
            ).select_from(new.join(placed, true())),
        )
        .returning(messages.c.no)
        .cte('stored')
    )
    state = _param('snapshot_state', String())
    header = {
        'step_index': _param('snapshot_step_index', Integer()),
        'timestamp': _param('snapshot_timestamp', snapshots.c.timestamp.type),
        'conversation_id': _param('snapshot_conversation_id', String()),
        'parent_run_id': _param('snapshot_parent_run_id', String()),
        'agent_name': _param('snapshot_agent_name', String()),
    }
    saved = (
        postgres_insert(snapshots)
        .from_select(
            [
                'run_id',
                'seq',
                *header,
                'idempotency_key',
                'line_id',
                'history_length',
                'through_message',
                'history_digest',
                'state',
            ],
            select(
                run,
                allocated.c.last_snapshot_seq,
                *header.values(),
                key,
                placed.c.line_id,
                _param('snapshot_length', Integer()),
                placed.c.through,
                _param('snapshot_digest', String()),
                state,
            ).select_from(allocated.join(placed, true())),
        )
        .returning(snapshots.c.seq)
        .cte('saved')
    )
    keep_older = _param('keep_older', Integer())
    older = select(snapshots.c.seq).where(snapshots.c.run_id == run).order_by(snapshots.c.seq.desc()).limit(keep_older)
    newest_complete = (
        select(func.max(snapshots.c.seq))
        .where(snapshots.c.run_id == run, snapshots.c.state == 'complete')
        .scalar_subquery()
    )
    pruned = (
        snapshots.delete()
        .where(
            snapshots.c.run_id == run,
            keep_older.is_not(None),
            exists(select(saved.c.seq)),
            snapshots.c.seq.not_in(older),
            or_(state == 'complete', snapshots.c.seq != func.coalesce(newest_complete, -1)),
        )
        .returning(snapshots.c.seq)
        .cte('pruned')
    )
    recorded, appended = _effects(run, allocated), _events(run, allocated)
    # The counter as the statement's snapshot saw it: one below the number taken unless another save of the run
    # committed after the statement began (it waited for that save's lock), whose snapshot the prune missed.
    seen = select(runs.c.last_snapshot_seq).where(runs.c.run_id == run, runs.c.id == incarnation).scalar_subquery()
    return select(
        select(allocated.c.id).scalar_subquery(),
        select(allocated.c.last_snapshot_seq).scalar_subquery(),
        _count(recorded),
        _count(appended),
        select(placed.c.line_id).scalar_subquery(),
        select(placed.c.through).scalar_subquery(),
        _count(stored),
        _count(pruned),
        select(allocated.c.last_snapshot_seq != seen + 1).scalar_subquery(),
    ).add_cte(
        locked,
        anchor,
        registration,
        claimed,
        allocated,
        taken,
        branched,
        placed,
        stored,
        saved,
        pruned,
        recorded,
        appended,
    )


@functools.cache
def flush_statements() -> tuple[Prepared, Prepared]:
    """`(FLUSH_EVENTS, FLUSH_SNAPSHOT)`, built on first use (importing SQLAlchemy's PostgreSQL dialect).

    `FLUSH_EVENTS`: tool effects and events of one run (parameters `run` and `events_parameters`), written if
    the run is stored. Returns the run's `id` (`NULL`: not stored, nothing written), then `NULL`, the effects
    recorded and the events appended, then two `NULL`s.

    `FLUSH_SNAPSHOT`: the same writes and one snapshot (see the module docstring). Returns the run's `id` and
    the snapshot's `seq` (both `NULL`: nothing written), the effects recorded, the events appended, the line
    and `through` of the snapshot's view, the message rows stored, the snapshots pruned, and whether a save
    of the run committed after the statement began (its prune missed that save's snapshot).
    """
    return Prepared(_flush_events()), Prepared(_flush_snapshot())


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a flush statement did."""

    run_pk: int | None
    """`runs.id` of the run; `None`: nothing was written."""
    seq: int | None
    line: int | None
    through: int | None
    saw_concurrent_save: bool = False
    """Whether another save of the run committed while the statement ran: retention must be applied again."""

    @property
    def applied(self) -> bool:
        return self.run_pk is not None

    @classmethod
    def of(cls, row: Sequence[Any] | None) -> Outcome:
        if row is None:
            return cls(None, None, None, None)
        run_pk, seq, _, _, line, through, _, _, concurrent = row[:9]
        return cls(run_pk, seq, line, through, concurrent is True)


def _instant(value: object) -> str:
    """A timestamp of a row in the JSON document: its ISO 8601 text (microseconds and offset kept, so exact)."""
    if isinstance(value, datetime):
        return require_utc(value).isoformat()
    raise TypeError(f'{type(value).__name__} is not stored as JSON')


def _document(rows_: list[dict[str, Any]]) -> str:
    """The JSON text of `rows_`, encoded in one call (the records' values are JSON's own types, or timestamps)."""
    return json.dumps(rows_, ensure_ascii=False, separators=(',', ':'), default=_instant)


def events_parameters(effects: Sequence[ToolEffectRecord], events_: Sequence[StepEvent]) -> dict[str, Any]:
    """The `effect_rows` and `event_rows` documents of `effects` and `events_` (their rows' values, by column)."""
    effect_rows = []
    for effect in effects:
        values = rows.tool_effect_values(effect)
        effect_rows.append({name: values[name] for name in _EFFECT_FIELDS})
    event_rows = []
    for ordinal, event in enumerate(events_):
        values = rows.event_values(event)
        row = {name: values[name] for name in _EVENT_FIELDS}
        row['ordinal'] = ordinal
        event_rows.append(row)
    return {'effect_rows': _document(effect_rows), 'event_rows': _document(event_rows)}


def message_parameters(planned: Sequence[NumberedRow], bodies: Sequence[PackedMessage]) -> dict[str, Any]:
    """The `message_rows` document of the planned rows (numbered on the head's line) with their packed bodies."""
    return {
        'message_rows': _document(
            [
                {
                    'no': row.no,
                    'position': row.position,
                    'digest': row.digest,
                    'body': body.data.decode(),
                    'externalized': body.externalized,
                }
                for row, body in zip(planned, bodies, strict=True)
            ]
        )
    }


def snapshot_parameters(snapshot: ContinuableSnapshot) -> dict[str, Any]:
    """The snapshot's own fields among `FLUSH_SNAPSHOT`'s parameters."""
    return {
        'snapshot_step_index': snapshot.step_index,
        'snapshot_timestamp': snapshot.timestamp,
        'snapshot_conversation_id': snapshot.conversation_id,
        'snapshot_parent_run_id': snapshot.parent_run_id,
        'snapshot_agent_name': snapshot.agent_name,
        'snapshot_key': snapshot.idempotency_key,
        'snapshot_state': snapshot.state,
    }
