"""The SQL store's write operations, each a synchronous function of one transaction.

`SqlStepStore` runs them through its `Database` (on SQLite's writer thread, in one greenlet on
an async engine, through `run_sync` on a caller's connection). Snapshot sequence numbers come from the run's row
(`UPDATE runs ... RETURNING`), which also serializes concurrent snapshot writers of one run,
across processes, reserves the message numbers the snapshot is expected to add (one statement
instead of a second update of the row, unless the expectation was wrong), and tells each writer
whether the run's messages are as it expected.
"""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import delete, select

from step_persistence.records import (
    ContinuableSnapshot,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepWrites,
    ToolEffectRecord,
)
from step_persistence.retention import retained_seqs
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.histories import HistoryPlan, HistoryRows
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.rows import RUN_KEY
from step_persistence.stores.sql.schema import events, messages, runs, snapshot_keys, snapshots, tool_effects
from step_persistence.stores.sql.statements import EVENTS_PER_STATEMENT, WriteStatements, events_rows_parameters

__all__ = ['Writes']

_CHILD_TABLES = (events, messages, snapshots, snapshot_keys, tool_effects)


class Writes:
    """The write operations of one store: its statements, histories and retention."""

    def __init__(self, statements: WriteStatements, histories: HistoryRows, *, max_snapshots: int | None) -> None:
        self._statements = statements
        self._histories = histories
        self._max_snapshots = max_snapshots

    def register_run(self, transaction: Transaction, record: RunRecord) -> int:
        """Insert the run and return its row's `id`; `ValueError` if the run id is taken."""
        inserted = transaction.execute(self._statements.register_run, rows.run_values(record)).first()
        if inserted is None:
            raise ValueError(f'run {record.run_id!r} is already registered')
        return int(inserted[0])

    def append_event(self, transaction: Transaction, event: StepEvent) -> None:
        written = transaction.execute(self._statements.append_event, rows.event_values(event)).rowcount
        if written == 0:
            self._require_run(transaction, event.run_id)

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
                self._require_run(transaction, run_id)

    def record_tool_effect(self, transaction: Transaction, record: ToolEffectRecord) -> None:
        if transaction.execute(self._statements.record_tool_effect, rows.tool_effect_values(record)).rowcount == 0:
            raise LookupError(f'run {record.run_id!r} is not registered')

    def save_snapshot(
        self, transaction: Transaction, snapshot: ContinuableSnapshot, plan: HistoryPlan, *, expected_rows: int
    ) -> None:
        """Write the snapshot, its new messages (packed in `plan`, `expected_rows` of them predicted) and retention."""
        run_id = snapshot.run_id
        allocation = {RUN_KEY: run_id, 'added': expected_rows}
        claim_and_allocate = self._statements.claim_and_allocate_snapshot
        if snapshot.idempotency_key is None:
            allocated = transaction.execute(self._statements.allocate_snapshot, allocation).first()
        elif claim_and_allocate is not None:
            key = {'idempotency_key': snapshot.idempotency_key}
            allocated = transaction.execute(claim_and_allocate, {**allocation, **key}).first()
            if allocated is None:
                self._require_run(transaction, run_id)
                return  # the run used this key already
        elif self._claim_snapshot_key(transaction, snapshot):
            allocated = transaction.execute(self._statements.allocate_snapshot, allocation).first()
        else:
            return  # the run used this key already
        if allocated is None:
            raise LookupError(f'run {run_id!r} is not registered')
        run_pk, seq, reserved_through = allocated
        history = self._histories.write(
            transaction,
            plan,
            run_id=run_id,
            run_pk=run_pk,
            last_no=reserved_through - expected_rows,
            reserved=expected_rows,
            encoded=snapshot.encoded_messages(),
        )
        transaction.execute(self._statements.insert_snapshot, rows.snapshot_values(snapshot, seq=seq, history=history))
        if self._max_snapshots is not None:
            self._prune(transaction, run_id, self._max_snapshots)

    def write_batch(self, transaction: Transaction, writes: StepWrites, plan: HistoryPlan) -> None:
        """Tool effects, then events, then snapshots, each in list order (the blobs they need first)."""
        self._histories.write_blobs(transaction, plan)
        for effect in writes.tool_effects:
            self.record_tool_effect(transaction, effect)
        self.append_events(transaction, writes.events)
        for snapshot, expected_rows in zip(writes.snapshots, plan.expected_rows, strict=True):
            self.save_snapshot(transaction, snapshot, plan, expected_rows=expected_rows)

    def delete_run(self, transaction: Transaction, run_id: str) -> None:
        for table in (*_CHILD_TABLES, runs):
            transaction.execute(delete(table).where(table.c.run_id == run_id))

    def _claim_snapshot_key(self, transaction: Transaction, snapshot: ContinuableSnapshot) -> bool:
        """Record the snapshot's idempotency key; `False` if the run already used it."""
        parameters = {RUN_KEY: snapshot.run_id, 'idempotency_key': snapshot.idempotency_key}
        if transaction.execute(self._statements.claim_snapshot_key, parameters).rowcount:
            return True
        self._require_run(transaction, snapshot.run_id)
        return False

    def _prune(self, transaction: Transaction, run_id: str, max_snapshots: int) -> None:
        found = transaction.execute(self._statements.snapshot_states, {RUN_KEY: run_id})
        stored: list[tuple[int, SnapshotState]] = [(seq, state) for seq, state in found]
        keep = set(retained_seqs(stored, max_snapshots))
        pruned = [seq for seq, _ in stored if seq not in keep]
        if pruned:
            transaction.execute(self._statements.prune_snapshots, {RUN_KEY: run_id, 'seqs': pruned})

    @staticmethod
    def _require_run(transaction: Transaction, run_id: str) -> None:
        if transaction.execute(select(runs.c.id).where(runs.c.run_id == run_id)).first() is None:
            raise LookupError(f'run {run_id!r} is not registered')
