"""The SQL store's write operations besides snapshots, each a synchronous function of one transaction.

`SqlStepStore` runs them through its `Database` (on SQLite's writer thread, in one greenlet on
an async engine, through `run_sync` on a caller's connection); a flush's tool effects and events
run in the transaction of its snapshots (`snapshot_saves.py`). Every statement comes from
`WriteStatements`, built once per dialect. A write for a run that is not stored inserts nothing: the
run is then registered bare (`register_bare`, `stores/_bare.py`) in the same transaction and the write
made again, which a repeated idempotency key also leaves writing nothing. Registering and deleting a
run keep its conversation's summary (`conversations.py`) in the same transaction; deleting one
reclaims the rows of its lines no other view uses (`reclaiming.release_lines`).
"""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.exc import IntegrityError

from step_persistence.records import RunRecord, StepEvent, ToolEffectRecord
from step_persistence.stores._bare import Write, bare_record
from step_persistence.stores.sql import conversations, rows
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.reclaiming import lines_of_run, release_lines
from step_persistence.stores.sql.schema import events, runs, snapshot_keys, snapshots, tool_effects
from step_persistence.stores.sql.statements import EVENTS_PER_STATEMENT, WriteStatements, events_rows_parameters

__all__ = ['Writes']

_CHILD_TABLES = (events, snapshots, snapshot_keys, tool_effects)
_DOOMED_RUN = select(runs.c.conversation_id).where(runs.c.run_id == bindparam(rows.RUN_KEY)).with_for_update()
_FILL_BARE_RUN = (
    update(runs).where(runs.c.run_id == bindparam(rows.RUN_KEY), runs.c.bare).values(bare=False).returning(runs.c.id)
)
"""Fills in a bare run's row: sets the columns of the values given (`rows.run_values` but `run_id`); and `run`."""


class Writes:
    """The write operations of one store on runs, events, tool effects and deletion, with its statements."""

    def __init__(self, statements: WriteStatements) -> None:
        self._statements = statements

    def register_run(self, transaction: Transaction, record: RunRecord) -> tuple[int, bool]:
        """Insert the run, or fill in its bare row; return the row's `id` and whether it was bare.
        `ValueError` if the run is registered already.

        A `continued` origin whose snapshot another stored run continues is stored as `forked`: the
        partial unique index refuses the first insert or fill (on PostgreSQL after waiting for a
        concurrent one to commit or roll back), and the run goes in again as a fork.
        """
        inserted = transaction.execute(self._statements.register_run, rows.run_values(record)).first()
        continued = record.origin is not None and record.origin.kind == 'continued'
        if inserted is None and continued:
            forked = rows.run_values(record, origin_kind='forked')
            inserted = transaction.execute(self._statements.register_run, forked).first()
        bare = inserted is None
        row = _fill_bare_run(transaction, record, continued=continued) if bare else inserted
        if row is None:
            raise ValueError(f'run {record.run_id!r} is already registered')
        run_pk = int(row[0])
        conversations.run_registered(transaction, record, run_pk)
        return run_pk, bare

    def register_bare(self, transaction: Transaction, write: Write) -> bool:
        """Register the run of `write`, its first write, bare unless it is stored; whether it was not."""
        values = {**rows.run_values(bare_record(write)), 'bare': True}
        return transaction.execute(self._statements.register_run, values).first() is not None

    def append_event(self, transaction: Transaction, event: StepEvent) -> None:
        self._append_counted(transaction, self._statements.append_event, [event], rows.event_values(event))

    def append_events(self, transaction: Transaction, events_: list[StepEvent]) -> None:
        """Append `events_` in order, several per statement: with many parameter sets where the driver
        counts the rows they insert (SQLite), else a multi-row statement per run (PostgreSQL)."""
        if len(events_) < 2:
            for event in events_:
                self.append_event(transaction, event)
            return
        if self._statements.counts_many_rows:
            many = [rows.event_values(event) for event in events_]
            self._append_counted(transaction, self._statements.append_event, events_, many)
            return
        for run_id, group in itertools.groupby(events_, key=lambda event: event.run_id):
            run_events = list(group)
            for start in range(0, len(run_events), EVENTS_PER_STATEMENT):
                chunk = run_events[start : start + EVENTS_PER_STATEMENT]
                named = events_rows_parameters(run_id, [rows.event_values(event) for event in chunk])
                self._append_counted(transaction, self._statements.append_events_of_run(len(chunk)), chunk, named)

    def _append_counted(
        self, transaction: Transaction, statement: Prepared, events_: list[StepEvent], parameters: Any
    ) -> None:
        """Append `events_` with `statement`; those it did not write for want of their run, once the run
        is registered bare, one by one.

        Fewer rows than events: a repeated idempotency key, or a run not stored. With none written,
        every event is appended again (a repeated key writes nothing again); with some, only those of
        the runs `register_bare` registered (some rows written: the statement was of one stored run
        on PostgreSQL, or on SQLite this transaction holds the database's write lock since then).
        """
        written = transaction.execute(statement, parameters).rowcount
        if written == len(events_):
            return
        firsts: dict[str, StepEvent] = {}
        for event in events_:
            firsts.setdefault(event.run_id, event)
        registered = {run_id for run_id, first in firsts.items() if self.register_bare(transaction, first)}
        for event in events_:
            if written == 0 or event.run_id in registered:
                transaction.execute(self._statements.append_event, rows.event_values(event))

    def record_tool_effect(self, transaction: Transaction, record: ToolEffectRecord) -> None:
        values = rows.tool_effect_values(record)
        if transaction.execute(self._statements.record_tool_effect, values).rowcount == 0:
            self.register_bare(transaction, record)
            transaction.execute(self._statements.record_tool_effect, values)

    def delete_run(self, transaction: Transaction, run_id: str) -> None:
        """Delete the run and everything of it, keep its conversation's summary, and reclaim the rows of its
        lines no remaining view uses. (Its row is locked first on PostgreSQL: saves of it in flight end first.)"""
        doomed = rows.fetch(transaction, _DOOMED_RUN, {rows.RUN_KEY: run_id})
        released = lines_of_run(transaction, run_id)
        for table in (*_CHILD_TABLES, runs):
            transaction.execute(delete(table).where(table.c.run_id == run_id))
        if doomed and isinstance(doomed[0][0], str):
            conversations.run_deleted(transaction, doomed[0][0])
        release_lines(transaction, released)


def _fill_bare_run(transaction: Transaction, record: RunRecord, *, continued: bool) -> Any:
    """Fill in the run's bare row with `record` (its `continued` origin stored as `forked` when another run
    continues that snapshot); the row's `id`, or `None` when the run is not bare.

    The fill of a `continued` origin runs in a savepoint: the unique index refusing it aborts only that.
    """
    values = {**rows.run_values(record), rows.RUN_KEY: record.run_id}
    del values['run_id']
    if not continued:
        return transaction.execute(_FILL_BARE_RUN, values).first()
    try:
        with transaction.connection.begin_nested():
            return transaction.execute(_FILL_BARE_RUN, values).first()
    except IntegrityError:
        return transaction.execute(_FILL_BARE_RUN, {**values, 'origin_kind': 'forked'}).first()
