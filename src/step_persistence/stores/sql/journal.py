"""`SqlJournal`: the durable journal (`JournalStore`) in the `durable_workflows` and `durable_units` tables.

It lives in the database of the `SqlStepStore` it is built on (revision 0008 creates the tables),
and runs each operation as the store does: one synchronous function in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import ColumnElement, case, delete, or_, select, update
from sqlalchemy.exc import DBAPIError

from step_persistence._arguments import require_text
from step_persistence._reading import read_each, read_or_skip
from step_persistence.durable.errors import LeaseLostError
from step_persistence.durable.records import DurableUnit, Fence, WorkflowRecord, WorkflowStatus
from step_persistence.records import utc_now
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.dialects import dialect_insert
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.schema import durable_units, durable_workflows
from step_persistence.stores.sql.store import SqlStepStore

__all__ = ['SqlJournal']

_WORKFLOW_COLUMNS = tuple(rows.readable(column) for column in durable_workflows.c)
_UNIT_COLUMNS = tuple(rows.readable(column) for column in durable_units.c)
"""Read so that a value its type cannot decode makes only its row unreadable (skipped and logged)."""


def _lease_is_free(now: datetime) -> ColumnElement[bool]:
    """`lease_is_free` as SQL."""
    workflow = durable_workflows.c
    return or_(workflow.owner.is_(None), workflow.lease_expires_at.is_(None), workflow.lease_expires_at <= now)


def _holds_lease(fence: Fence) -> ColumnElement[bool]:
    """`holds_lease` as SQL."""
    return (durable_workflows.c.owner == fence.owner) & (durable_workflows.c.fencing_epoch == fence.epoch)


def _workflow_values(record: WorkflowRecord) -> dict[str, Any]:
    return record.model_dump()


def _workflow_from_row(row: Mapping[str, Any]) -> WorkflowRecord:
    return WorkflowRecord.model_validate(dict(row))


def _unit_values(unit: DurableUnit) -> dict[str, Any]:
    values = unit.model_dump()
    externalized = values.pop('externalized')
    stored = {'value': unit.result, 'externalized': True} if externalized else {'value': unit.result}
    values['result'] = None if unit.status != 'completed' else stored
    return values


def _unit_from_row(row: Mapping[str, Any]) -> DurableUnit:
    values = dict(row)
    stored = values.pop('result')
    if values.get('status') == 'completed':
        valid = isinstance(stored, dict) and (
            set(stored) == {'value'} or (set(stored) == {'value', 'externalized'} and stored['externalized'] is True)
        )
        if not valid:
            raise ValueError(
                f"a completed unit's result must be stored as {{'value': ...}} (and 'externalized': true), "
                f'not {stored!r:.200}'
            )
        values['result'] = stored['value']
        values['externalized'] = 'externalized' in stored
    return DurableUnit.model_validate(values)


class SqlJournal:
    """The journal of `store`'s database; writes create or upgrade the schema as the store's writes do."""

    def __init__(self, store: SqlStepStore) -> None:
        self._store = store
        database = store._db
        insert = dialect_insert(database.dialect_name)
        self._insert_workflow = insert(durable_workflows).on_conflict_do_nothing(
            index_elements=[durable_workflows.c.workflow_id]
        )
        unit_insert = insert(durable_units)
        excluded = unit_insert.excluded
        again = excluded.status == 'started'
        self._upsert_unit = unit_insert.on_conflict_do_update(
            index_elements=[durable_units.c.workflow_id, durable_units.c.unit_key],
            set_={
                'name': excluded.name,
                'kind': excluded.kind,
                'status': excluded.status,
                'tool_call_id': excluded.tool_call_id,
                'fingerprint': excluded.fingerprint,
                'result': excluded.result,
                'error': excluded.error,
                'attempts': case((again, durable_units.c.attempts + 1), else_=durable_units.c.attempts),
                'started_at': case((again, excluded.started_at), else_=durable_units.c.started_at),
                'ended_at': excluded.ended_at,
            },
            # A completed unit is final (`next_unit_state`): a later write leaves it as it is.
            where=durable_units.c.status != 'completed',
        )

    def __repr__(self) -> str:
        return f'SqlJournal({self._store!r})'

    async def _write(self, operation: Any) -> Any:
        await self._store._ready()
        try:
            return await self._store._db.run(operation, write=True)
        except DBAPIError as error:
            await self._store._explain(error)

    async def _read(self, statement: Any) -> list[Any]:
        try:
            return await self._store._read(statement)
        except DBAPIError as error:
            await self._store._explain(error)

    def _start(self, transaction: Transaction, *, values: dict[str, Any]) -> Any:
        if transaction.execute(self._insert_workflow, values).rowcount == 0:
            transaction.execute(
                update(durable_workflows)
                .where(durable_workflows.c.workflow_id == values['workflow_id'])
                .values(attempts=durable_workflows.c.attempts + 1, status='running', updated_at=values['updated_at'])
            )
        return transaction.execute(
            select(*_WORKFLOW_COLUMNS).where(durable_workflows.c.workflow_id == values['workflow_id'])
        ).first()

    async def start_workflow(self, record: WorkflowRecord) -> WorkflowRecord:
        require_text('workflow_id', record.workflow_id)
        row = await self._write(partial(self._start, values=_workflow_values(record)))
        return _workflow_from_row(row._mapping)

    async def get_workflow(self, *, workflow_id: str) -> WorkflowRecord | None:
        require_text('workflow_id', workflow_id)
        found = await self._read(select(*_WORKFLOW_COLUMNS).where(durable_workflows.c.workflow_id == workflow_id))
        if not found:
            return None
        return read_or_skip(f'durable workflow {workflow_id!r}', partial(_workflow_from_row, found[0]._mapping))

    async def claim_workflow(
        self,
        *,
        workflow_id: str,
        owner: str,
        lease_expires_at: datetime,
        now: datetime,
        running_only: bool = False,
        take_over: bool = False,
    ) -> WorkflowRecord | None:
        require_text('workflow_id', workflow_id)
        require_text('owner', owner)
        conditions = [durable_workflows.c.workflow_id == workflow_id]
        if not take_over:
            conditions.append(_lease_is_free(now))
        if running_only:
            conditions.append(durable_workflows.c.status == 'running')
        # One UPDATE: PostgreSQL evaluates its WHERE again on the row it locked, so two claims never both match
        # (two take-overs both match, one after the other, each raising the epoch it finds).
        claim = (
            update(durable_workflows)
            .where(*conditions)
            .values(
                owner=owner,
                lease_expires_at=lease_expires_at,
                fencing_epoch=durable_workflows.c.fencing_epoch + 1,
                updated_at=now,
            )
        )
        read = select(*_WORKFLOW_COLUMNS).where(durable_workflows.c.workflow_id == workflow_id)

        def attempt(transaction: Transaction) -> Any:
            transaction.execute(claim)
            return transaction.execute(read).first()

        if await self._store._holds_nothing():
            return None
        row = await self._write(attempt)
        return None if row is None else _workflow_from_row(row._mapping)

    async def renew_lease(self, *, workflow_id: str, fence: Fence, lease_expires_at: datetime) -> bool:
        require_text('workflow_id', workflow_id)
        renew = (
            update(durable_workflows)
            .where(durable_workflows.c.workflow_id == workflow_id, _holds_lease(fence))
            .values(lease_expires_at=lease_expires_at)
        )
        return bool(await self._write(lambda transaction: transaction.execute(renew).rowcount))

    async def list_abandoned(self, *, now: datetime) -> list[WorkflowRecord]:
        found = await self._read(
            select(*_WORKFLOW_COLUMNS)
            .where(durable_workflows.c.status == 'running', _lease_is_free(now))
            .order_by(durable_workflows.c.updated_at, durable_workflows.c.workflow_id)
        )
        return read_each(
            found, lambda row: f'durable workflow {row.workflow_id!r}', lambda row: _workflow_from_row(row._mapping)
        )

    @staticmethod
    def _check_fence(transaction: Transaction, workflow_id: str, fence: Fence | None) -> None:
        """`LookupError` if the workflow is not stored, `LeaseLostError` if `fence` does not hold its lease.

        The row is locked (`FOR SHARE` on PostgreSQL; SQLite's writer holds the database) until the
        transaction ends, so no claim lands between this check and the write it guards.
        """
        found = transaction.execute(
            select(durable_workflows.c.owner, durable_workflows.c.fencing_epoch)
            .where(durable_workflows.c.workflow_id == workflow_id)
            .with_for_update(read=True)
        ).first()
        if found is None:
            raise LookupError(f'no durable workflow {workflow_id!r} is stored')
        if fence is not None and (found.owner, found.fencing_epoch) != (fence.owner, fence.epoch):
            raise LeaseLostError(workflow_id=workflow_id, owner=fence.owner, epoch=fence.epoch)

    async def end_workflow(self, *, workflow_id: str, status: WorkflowStatus, fence: Fence | None = None) -> None:
        require_text('workflow_id', workflow_id)
        statement = (
            update(durable_workflows)
            .where(durable_workflows.c.workflow_id == workflow_id)
            .values(status=status, owner=None, lease_expires_at=None, updated_at=utc_now())
        )

        def end(transaction: Transaction) -> None:
            self._check_fence(transaction, workflow_id, fence)
            transaction.execute(statement)

        await self._write(end)

    async def record_unit(self, unit: DurableUnit, *, fence: Fence | None = None) -> None:
        values = _unit_values(unit)

        def record(transaction: Transaction) -> None:
            self._check_fence(transaction, unit.workflow_id, fence)
            transaction.execute(self._upsert_unit, values)

        await self._write(record)

    async def list_units(self, *, workflow_id: str) -> list[DurableUnit]:
        require_text('workflow_id', workflow_id)
        found = await self._read(
            select(*_UNIT_COLUMNS)
            .where(durable_units.c.workflow_id == workflow_id)
            .order_by(durable_units.c.started_at, durable_units.c.unit_key)
        )
        return read_each(
            found,
            lambda row: f'durable unit {row.unit_key!r} of workflow {workflow_id!r}',
            lambda row: _unit_from_row(row._mapping),
        )

    async def delete_workflow(self, *, workflow_id: str) -> None:
        require_text('workflow_id', workflow_id)
        if await self._store._holds_nothing():
            return

        def remove(transaction: Transaction) -> None:
            transaction.execute(delete(durable_units).where(durable_units.c.workflow_id == workflow_id))
            transaction.execute(delete(durable_workflows).where(durable_workflows.c.workflow_id == workflow_id))

        await self._write(remove)
