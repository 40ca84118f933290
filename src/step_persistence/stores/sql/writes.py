"""The SQL store's write operations besides snapshots, each a synchronous function of one transaction.

`SqlStepStore` runs them through its `Database` (on SQLite's writer thread, in one greenlet on
an async engine, through `run_sync` on a caller's connection); a flush's tool effects and events
run in the transaction of its snapshots (`snapshot_saves.py`). Every statement comes from
`WriteStatements`, built once per dialect. A write for an unregistered run inserts nothing, and
`require_run` tells that from a repeated idempotency key. Registering and deleting a run keep its
conversation's summary (`conversations.py`) in the same transaction; deleting one reclaims the
rows of its lines no other view uses (`reclaiming.release_lines`).
"""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import bindparam, delete, select

from step_persistence.records import RunRecord, StepEvent, ToolEffectRecord
from step_persistence.stores.sql import conversations, rows
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.reclaiming import lines_of_run, release_lines
from step_persistence.stores.sql.schema import events, runs, snapshot_keys, snapshots, tool_effects
from step_persistence.stores.sql.statements import EVENTS_PER_STATEMENT, WriteStatements, events_rows_parameters

__all__ = ['Writes', 'require_run']

_CHILD_TABLES = (events, snapshots, snapshot_keys, tool_effects)
_DOOMED_RUN = select(runs.c.conversation_id).where(runs.c.run_id == bindparam(rows.RUN_KEY)).with_for_update()


def require_run(transaction: Transaction, run_id: str) -> None:
    """Raise `LookupError` unless the run is registered."""
    if transaction.execute(select(runs.c.id).where(runs.c.run_id == run_id)).first() is None:
        raise LookupError(f'run {run_id!r} is not registered')


class Writes:
    """The write operations of one store on runs, events, tool effects and deletion, with its statements."""

    def __init__(self, statements: WriteStatements) -> None:
        self._statements = statements

    def register_run(self, transaction: Transaction, record: RunRecord) -> int:
        """Insert the run and return its row's `id`; `ValueError` if the run id is taken.

        A `continued` origin whose snapshot another stored run continues is stored as `forked`: the
        partial unique index refuses the first insert (on PostgreSQL after waiting for a concurrent
        one to commit or roll back), and the run goes in again as a fork.
        """
        inserted = transaction.execute(self._statements.register_run, rows.run_values(record)).first()
        if inserted is None and record.origin is not None and record.origin.kind == 'continued':
            forked = rows.run_values(record, origin_kind='forked')
            inserted = transaction.execute(self._statements.register_run, forked).first()
        if inserted is None:
            raise ValueError(f'run {record.run_id!r} is already registered')
        run_pk = int(inserted[0])
        conversations.run_registered(transaction, record, run_pk)
        return run_pk

    def append_event(self, transaction: Transaction, event: StepEvent) -> None:
        written = transaction.execute(self._statements.append_event, rows.event_values(event)).rowcount
        if written == 0:
            require_run(transaction, event.run_id)

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
        if transaction.execute(statement, parameters).rowcount != len(events_):
            # A repeated idempotency key, or an unregistered run: only the latter is an error.
            for run_id in dict.fromkeys(event.run_id for event in events_):
                require_run(transaction, run_id)

    def record_tool_effect(self, transaction: Transaction, record: ToolEffectRecord) -> None:
        if transaction.execute(self._statements.record_tool_effect, rows.tool_effect_values(record)).rowcount == 0:
            raise LookupError(f'run {record.run_id!r} is not registered')

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
