"""The write statements of the SQL store, built once per dialect with bound parameters.

Building a SQLAlchemy statement costs more than executing a cached one, so the statements of
the hot paths are built when a store is created and executed with a dict of values each time.
Uniqueness is left to constraints (`INSERT ... ON CONFLICT`); events, tool effects and snapshot
keys are inserted with `INSERT ... SELECT ... FROM runs WHERE run_id = :run`, so a write for a run
not stored inserts nothing (and the caller registers the run bare and writes again, `writes.py`)
without depending on foreign-key enforcement or aborting a caller's PostgreSQL transaction with a
constraint error.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    Table,
    bindparam,
    column,
    delete,
    exists,
    func,
    literal_column,
    select,
    update,
    values,
)
from sqlalchemy.sql import Delete, Update
from sqlalchemy.sql.selectable import CTE

from step_persistence.stores.sql import rows
from step_persistence.stores.sql.dialects import DialectInsert, dialect_insert
from step_persistence.stores.sql.flush_statement import flush_statements, tool_effect_merge
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

__all__ = ['EVENTS_PER_STATEMENT', 'WriteStatements', 'events_rows_parameters']


def _from_run(insert: Any, table: Table, names: tuple[str, ...]) -> DialectInsert:
    """`INSERT INTO table (names) SELECT runs.run_id, :name... FROM runs WHERE runs.run_id = :run`."""
    columns = (
        runs.c.run_id if name == 'run_id' else bindparam(name, type_=table.c[name].type).label(name) for name in names
    )
    source = select(*columns).where(runs.c.run_id == bindparam(RUN_KEY))
    statement: DialectInsert = insert(table).from_select(list(names), source)
    return statement


EVENTS_PER_STATEMENT = 16
"""The most events one multi-row `INSERT` appends (on dialects that append several with one statement)."""

_EVENT_VALUE_FIELDS = tuple(name for name in rows.EVENT_FIELDS if name != 'run_id')


@functools.cache
def _events_from_values(dialect_name: str, count: int) -> Prepared:
    """`INSERT INTO events (...) SELECT runs.run_id, new_events... FROM (VALUES ...) AS new_events JOIN runs
    ON runs.run_id = :run ORDER BY new_events.ordinal`, for `count` rows: the values of row `i` are
    named `<field>_<i>`. One statement (one round trip) that reports how many rows it inserted."""
    new_events = values(
        *(column(name, events.c[name].type) for name in _EVENT_VALUE_FIELDS),
        column('ordinal', Integer),
        name='new_events',
    ).data(
        [
            (
                *(bindparam(f'{name}_{row}', type_=events.c[name].type) for name in _EVENT_VALUE_FIELDS),
                literal_column(str(row), Integer),
            )
            for row in range(count)
        ]
    )
    source = (
        select(runs.c.run_id, *(new_events.c[name] for name in _EVENT_VALUE_FIELDS))
        .select_from(new_events.join(runs, runs.c.run_id == bindparam(RUN_KEY)))
        .order_by(new_events.c.ordinal)
    )
    insert = dialect_insert(dialect_name)
    return Prepared(
        insert(events)
        .from_select(list(rows.EVENT_FIELDS), source)
        .on_conflict_do_nothing(
            index_elements=[events.c.run_id, events.c.idempotency_key],
            index_where=events.c.idempotency_key.is_not(None),
        )
    )


def events_rows_parameters(run_id: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of `_events_from_values` for events of one run, given each one's `rows.event_values`."""
    named: dict[str, Any] = {RUN_KEY: run_id}
    for row, each in enumerate(parameters):
        named.update((f'{name}_{row}', each[name]) for name in _EVENT_VALUE_FIELDS)
    return named


def _on_line(allocate: Update, claimed: CTE | None) -> Update:
    """`allocate` (`allocate_snapshot`), with the key claimed by `claimed` when given, checking the head and
    taking its line's numbers in the same statement (`WriteStatements.allocate_on_line`)."""
    anchor = (
        select(snapshots.c.seq)
        .where(snapshots.c.run_id == bindparam('anchor_run'), snapshots.c.seq == bindparam('anchor_seq'))
        .with_for_update(read=True, key_share=True)
        .cte('anchor')
    )
    registration = runs.alias('registration')
    taking = [
        history_lines.c.id == bindparam('line'),
        history_lines.c.last_message_no == bindparam('through'),
        exists(select(anchor.c.seq)),
        exists().where(registration.c.run_id == bindparam(RUN_KEY), registration.c.id == bindparam('incarnation')),
    ]
    if claimed is not None:
        taking.append(exists(select(claimed.c.run_id)))
        allocate = allocate.where(exists(select(claimed.c.run_id))).add_cte(claimed)
    taken = (
        update(history_lines)
        .where(*taking)
        .values(last_message_no=history_lines.c.last_message_no + bindparam('added', type_=Integer))
        .returning(history_lines.c.id)
        .cte('taken')
    )
    return allocate.returning(
        select(func.count()).select_from(anchor).scalar_subquery(),
        select(func.count()).select_from(taken).scalar_subquery(),
    ).add_cte(anchor, taken)


@dataclass(frozen=True)
class WriteStatements:
    """Every statement the store's write operations execute, for one dialect."""

    register_run: Prepared
    """Values `rows.run_values` (and `bare` for a bare run); returns the new row's `id`, or nothing when a
    unique index refuses it (a duplicate `run_id`, or a second `continued` run of one snapshot:
    `uq_runs_origin_run_id_origin_seq`)."""
    append_event: Prepared
    """Values `rows.event_values` without `run_id`, and `run`; a repeated idempotency key inserts nothing."""
    record_tool_effect: Prepared
    """Values `rows.tool_effect_values` without `run_id`, and `run`; upserts by `(run_id, tool_call_id)`."""
    claim_snapshot_key: Prepared
    """Values `idempotency_key` and `run`; inserts nothing when the run already used the key."""
    allocate_snapshot: Prepared
    """Value `run`: takes the run's next `last_snapshot_seq` and returns the run's `id` and that sequence
    number (holding the run's row until commit)."""
    claim_and_allocate_snapshot: Prepared | None
    """Where the dialect runs an `INSERT` inside a statement (PostgreSQL: `WITH ... INSERT ...
    RETURNING`): `claim_snapshot_key` and then `allocate_snapshot` in one statement, values
    `run` and `idempotency_key`. Returns `allocate_snapshot`'s row, or nothing when the key was
    used already (or the run is not registered); `None` elsewhere."""
    allocate_on_line: tuple[Prepared, Prepared] | None
    """Where the dialect runs an `UPDATE` inside a statement (PostgreSQL): `allocate_snapshot` (first) or
    `claim_and_allocate_snapshot` (second) together with the checks of the head a save builds on and
    `append_to_line`, in one statement. Values besides theirs: `incarnation` (the head's `runs.id`),
    `anchor_run` and `anchor_seq` (its anchor, locked `FOR KEY SHARE`), `line`, `through` and `added`;
    the numbers are taken only when the run is that registration, the anchor is stored and the key
    was claimed. Returns the run's `id`, the sequence number, whether the anchor is stored (1 or 0)
    and whether the numbers were taken (1 or 0); nothing as `allocate_snapshot`'s variants do."""
    append_to_line: Prepared
    """Values `line`, `through` and `added`: adds `added` to the line's `last_message_no` if it is still
    `through` (counted: 0 rows when another writer appended since, or the line is gone)."""
    insert_line: Prepared
    """Values `last_message_no`, `base_line_id`, `base_length`, `base_through` (`None`: no base); returns
    the new line's `id`."""
    insert_snapshot: Prepared
    """Values `rows.snapshot_values`."""
    insert_messages: Prepared
    """Values of `messages` rows (a list of dicts)."""
    snapshot_states: Prepared
    """Value `run`: `(seq, state)` of every snapshot of the run."""
    prune_snapshots: Delete
    """Values `run` and `seqs` (a list): deletes those snapshots of the run."""
    flush_events: Prepared | None
    """Where a flush of one run can be one statement (PostgreSQL): its tool effects and events
    (`FLUSH_EVENTS` of `flush_statement.flush_statements`); `None` elsewhere."""
    flush_snapshot: Prepared | None
    """The same, with one snapshot (`FLUSH_SNAPSHOT` there); `None` elsewhere."""
    counts_many_rows: bool
    """Whether a statement run with many parameter sets reports the total rows it wrote (SQLite does;
    asyncpg's `executemany` does not), so that events can be appended with one statement."""
    dialect_name: str

    def append_events_of_run(self, count: int) -> Prepared:
        """For dialects that do not count many rows: `count` (at most `EVENTS_PER_STATEMENT`) events of one
        run in one multi-row statement; its parameters come from `events_rows_parameters`."""
        return _events_from_values(self.dialect_name, count)

    @classmethod
    def for_dialect(cls, dialect_name: str) -> WriteStatements:
        insert = dialect_insert(dialect_name)
        events_insert = _from_run(insert, events, rows.EVENT_FIELDS)
        effects_insert = _from_run(insert, tool_effects, rows.TOOL_EFFECT_FIELDS)
        excluded = effects_insert.excluded
        claim_snapshot_key = _from_run(insert, snapshot_keys, ('run_id', 'idempotency_key')).on_conflict_do_nothing(
            index_elements=[snapshot_keys.c.run_id, snapshot_keys.c.idempotency_key]
        )
        allocate_snapshot = (
            update(runs)
            .where(runs.c.run_id == bindparam(RUN_KEY))
            .values(last_snapshot_seq=runs.c.last_snapshot_seq + 1)
            .returning(runs.c.id, runs.c.last_snapshot_seq)
        )
        claimed = claim_snapshot_key.returning(snapshot_keys.c.run_id).cte('claimed')
        claim_and_allocate = allocate_snapshot.where(exists(select(claimed.c.run_id))).add_cte(claimed)
        postgres = dialect_name == 'postgresql'
        return cls(
            register_run=Prepared(insert(runs).on_conflict_do_nothing().returning(runs.c.id)),
            append_event=Prepared(
                events_insert.on_conflict_do_nothing(
                    index_elements=[events.c.run_id, events.c.idempotency_key],
                    index_where=events.c.idempotency_key.is_not(None),
                )
            ),
            record_tool_effect=Prepared(
                effects_insert.on_conflict_do_update(
                    index_elements=[tool_effects.c.run_id, tool_effects.c.tool_call_id],
                    set_=tool_effect_merge(excluded, tool_effects),
                )
            ),
            claim_snapshot_key=Prepared(claim_snapshot_key),
            allocate_snapshot=Prepared(allocate_snapshot),
            claim_and_allocate_snapshot=Prepared(claim_and_allocate) if postgres else None,
            allocate_on_line=(
                (Prepared(_on_line(allocate_snapshot, None)), Prepared(_on_line(allocate_snapshot, claimed)))
                if postgres
                else None
            ),
            append_to_line=Prepared(
                update(history_lines)
                .where(history_lines.c.id == bindparam('line'), history_lines.c.last_message_no == bindparam('through'))
                .values(last_message_no=history_lines.c.last_message_no + bindparam('added', type_=Integer))
            ),
            insert_line=Prepared(history_lines.insert().returning(history_lines.c.id)),
            insert_snapshot=Prepared(snapshots.insert()),
            insert_messages=Prepared(messages.insert()),
            snapshot_states=Prepared(
                select(snapshots.c.seq, snapshots.c.state).where(snapshots.c.run_id == bindparam(RUN_KEY))
            ),
            prune_snapshots=delete(snapshots).where(
                snapshots.c.run_id == bindparam(RUN_KEY), snapshots.c.seq.in_(bindparam('seqs', expanding=True))
            ),
            flush_events=flush_statements()[0] if postgres else None,
            flush_snapshot=flush_statements()[1] if postgres else None,
            counts_many_rows=dialect_name == 'sqlite',
            dialect_name=dialect_name,
        )
