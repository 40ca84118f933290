"""`MongoJournal`: the durable journal (`JournalStore`) in the `durable_workflows` and `durable_units` collections.

It lives in the database of the `MongoStepStore` it is built on. A workflow's document has the
workflow id as `_id`, so the first start wins atomically (its insert; a later start counts an
attempt); a unit's `_id` is its workflow id and key, and a write matches it only while it is not
`completed`, so a completed unit never changes (the upsert that would replace it collides with it
instead, and is ignored). Results and inputs are stored as JSON text: their keys are the
application's, which BSON field names could not all be.
Timestamps are a BSON date plus `<name>_us`, as in the step store's documents.

A claim, a renewal and a workflow's end are one `findAndModify`/`update` filtered on the lease, so
they are atomic. A fenced unit write spans two documents (the workflow's lease, the unit): on a
server that runs transactions (a replica set or a sharded cluster, as the server's `hello` says) it
is one transaction that first increments the workflow's `fenced_writes` filtered on the lease and
then writes the unit, so a claim (a write of the same workflow document) either comes before it
(the write is refused) or conflicts with it and lands after its commit. On a standalone server,
which has no transactions, it checks the lease and then writes: a claim landing between them lets
one write of the stale owner through (see docs/durable.md for the exact guarantee).
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from pymongo import ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import DuplicateKeyError

from step_persistence._arguments import require_text
from step_persistence._reading import read_each, read_or_skip
from step_persistence.durable.errors import LeaseLostError
from step_persistence.durable.records import DurableUnit, Fence, WorkflowRecord, WorkflowStatus
from step_persistence.records import utc_now
from step_persistence.stores.mongo._client import JOURNAL_UNITS, JOURNAL_WORKFLOWS, Database
from step_persistence.stores.mongo._documents import _time, with_time
from step_persistence.stores.mongo.store import MongoStepStore

__all__ = ['MongoJournal']

UNIT_ORDER = [('workflow_id', 1), ('started_at', 1), ('started_at_us', 1), ('unit_key', 1)]


def _unit_id(workflow_id: str, unit_key: str) -> str:
    return f'{len(workflow_id)}:{workflow_id}:{unit_key}'


def _lease_is_free(now: datetime) -> dict[str, Any]:
    """`lease_is_free` as a filter (the expiry compared exactly: its BSON date, then its micros)."""
    at = with_time({}, 'at', now)
    expired = [
        {'lease_expires_at': {'$lt': at['at']}},
        {'lease_expires_at': at['at'], 'lease_expires_at_us': {'$lte': at['at_us']}},
    ]
    return {'$or': [{'owner': None}, {'lease_expires_at': None}, *expired]}


def _holds_lease(fence: Fence) -> dict[str, Any]:
    return {'owner': fence.owner, 'fencing_epoch': fence.epoch}


def _workflow_from_document(document: Mapping[str, Any]) -> WorkflowRecord:
    return WorkflowRecord(
        workflow_id=document['_id'],
        agent_name=document.get('agent_name'),
        run_id=document.get('run_id'),
        status=document['status'],
        code_version=document.get('code_version'),
        inputs=json.loads(document['inputs']),
        attempts=document['attempts'],
        owner=document.get('owner'),
        lease_expires_at=_time(document, 'lease_expires_at'),
        fencing_epoch=document['fencing_epoch'],
        created_at=_time(document, 'created_at'),
        updated_at=_time(document, 'updated_at'),
    )


def _unit_from_document(document: Mapping[str, Any]) -> DurableUnit:
    result = document.get('result')
    if document.get('status') == 'completed' and not isinstance(result, str):
        raise ValueError(f"a completed unit's result must be stored as JSON text, not {result!r}")
    return DurableUnit(
        workflow_id=document['workflow_id'],
        unit_key=document['unit_key'],
        name=document['name'],
        kind=document['kind'],
        status=document['status'],
        tool_call_id=document.get('tool_call_id'),
        fingerprint=document.get('fingerprint'),
        result=json.loads(result) if isinstance(result, str) else None,
        externalized=document.get('externalized', False),
        error=document.get('error'),
        attempts=document['attempts'],
        started_at=_time(document, 'started_at'),
        ended_at=_time(document, 'ended_at'),
    )


class MongoJournal:
    """The journal of `store`'s database; the units' index is created at each workflow's start."""

    def __init__(self, store: MongoStepStore) -> None:
        self._store = store
        self._transactions: bool | None = None
        """Whether the server runs multi-document transactions (asked once, with `hello`)."""

    def __repr__(self) -> str:
        return f'MongoJournal({self._store!r})'

    def _db(self) -> Database:
        return self._store._on_loop.get().db

    async def start_workflow(self, record: WorkflowRecord) -> WorkflowRecord:
        require_text('workflow_id', record.workflow_id)
        db = self._db()
        await db[JOURNAL_UNITS].create_index(UNIT_ORDER)
        first: dict[str, Any] = {
            '_id': record.workflow_id,
            'agent_name': record.agent_name,
            'run_id': record.run_id,
            'status': 'running',
            'code_version': record.code_version,
            'inputs': json.dumps(record.inputs),
            'attempts': 1,
            'owner': record.owner,
            'fencing_epoch': record.fencing_epoch,
        }
        for name in ('lease_expires_at', 'created_at', 'updated_at'):
            with_time(first, name, getattr(record, name))
        workflows = db[JOURNAL_WORKFLOWS]
        try:
            await workflows.insert_one(first)
        except DuplicateKeyError:  # started before: this is one more start of it
            again = {'$set': with_time({'status': 'running'}, 'updated_at', record.updated_at), '$inc': {'attempts': 1}}
            stored = await workflows.find_one_and_update(
                {'_id': record.workflow_id}, again, return_document=ReturnDocument.AFTER
            )
            if stored is None:
                raise LookupError(f'durable workflow {record.workflow_id!r} was deleted while it started') from None
            return _workflow_from_document(stored)
        return _workflow_from_document(first)

    async def get_workflow(self, *, workflow_id: str) -> WorkflowRecord | None:
        require_text('workflow_id', workflow_id)
        found = await self._db()[JOURNAL_WORKFLOWS].find_one({'_id': workflow_id})
        if found is None:
            return None
        return read_or_skip(f'durable workflow {workflow_id!r}', lambda: _workflow_from_document(found))

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
        workflows = self._db()[JOURNAL_WORKFLOWS]
        condition: dict[str, Any] = {'_id': workflow_id, **({} if take_over else _lease_is_free(now))}
        if running_only:
            condition['status'] = 'running'
        claim = {
            '$set': with_time(with_time({'owner': owner}, 'lease_expires_at', lease_expires_at), 'updated_at', now),
            '$inc': {'fencing_epoch': 1},
        }
        claimed = await workflows.find_one_and_update(condition, claim, return_document=ReturnDocument.AFTER)
        stored = claimed if claimed is not None else await workflows.find_one({'_id': workflow_id})
        return None if stored is None else _workflow_from_document(stored)

    async def renew_lease(self, *, workflow_id: str, fence: Fence, lease_expires_at: datetime) -> bool:
        require_text('workflow_id', workflow_id)
        renewed = await self._db()[JOURNAL_WORKFLOWS].update_one(
            {'_id': workflow_id, **_holds_lease(fence)}, {'$set': with_time({}, 'lease_expires_at', lease_expires_at)}
        )
        return renewed.matched_count == 1

    async def list_abandoned(self, *, now: datetime) -> list[WorkflowRecord]:
        found = [
            document
            async for document in self._db()[JOURNAL_WORKFLOWS]
            .find({'status': 'running', **_lease_is_free(now)})
            .sort([('updated_at', 1), ('updated_at_us', 1), ('_id', 1)])
        ]
        return read_each(found, lambda document: f'durable workflow {document.get("_id")!r}', _workflow_from_document)

    async def _check_fence(self, workflow_id: str, fence: Fence | None) -> None:
        stored = await self._db()[JOURNAL_WORKFLOWS].find_one({'_id': workflow_id}, {'owner': 1, 'fencing_epoch': 1})
        if stored is None:
            raise LookupError(f'no durable workflow {workflow_id!r} is stored')
        if fence is not None and (stored.get('owner'), stored.get('fencing_epoch')) != (fence.owner, fence.epoch):
            raise LeaseLostError(workflow_id=workflow_id, owner=fence.owner, epoch=fence.epoch)

    async def end_workflow(self, *, workflow_id: str, status: WorkflowStatus, fence: Fence | None = None) -> None:
        require_text('workflow_id', workflow_id)
        ended = with_time({'status': status, 'owner': None}, 'lease_expires_at', None)
        with_time(ended, 'updated_at', utc_now())
        condition = {'_id': workflow_id, **({} if fence is None else _holds_lease(fence))}
        if (await self._db()[JOURNAL_WORKFLOWS].update_one(condition, {'$set': ended})).matched_count == 0:
            await self._check_fence(workflow_id, fence)  # says why: not stored, or the lease was lost

    async def record_unit(self, unit: DurableUnit, *, fence: Fence | None = None) -> None:
        require_text('workflow_id', unit.workflow_id)
        require_text('unit_key', unit.unit_key)
        db = self._db()
        fields: dict[str, Any] = {
            'name': unit.name,
            'kind': unit.kind,
            'status': unit.status,
            'tool_call_id': unit.tool_call_id,
            'fingerprint': unit.fingerprint,
            'result': None if unit.status != 'completed' else json.dumps(unit.result),
            'externalized': unit.externalized,
            'error': unit.error,
        }
        with_time(fields, 'ended_at', unit.ended_at)
        identity = {'workflow_id': unit.workflow_id, 'unit_key': unit.unit_key}
        if unit.status == 'started':
            # Started (again): a new start time, one more attempt (`next_unit_state`).
            update = {'$set': with_time(fields, 'started_at', unit.started_at), '$setOnInsert': identity}
            update['$inc'] = {'attempts': 1}
        else:
            # Ended: the start time and attempts stay as the start wrote them.
            on_insert = with_time({**identity, 'attempts': unit.attempts}, 'started_at', unit.started_at)
            update = {'$set': fields, '$setOnInsert': on_insert}

        async def write(session: AsyncClientSession | None) -> None:
            await db[JOURNAL_UNITS].update_one(
                {'_id': _unit_id(unit.workflow_id, unit.unit_key), 'status': {'$ne': 'completed'}},
                update,
                upsert=True,
                session=session,
            )

        with contextlib.suppress(DuplicateKeyError):  # the unit is completed: nothing changes it
            await self._fenced(db, unit.workflow_id, fence, write)

    async def _fenced(
        self,
        db: Database,
        workflow_id: str,
        fence: Fence | None,
        write: Callable[[AsyncClientSession | None], Awaitable[None]],
    ) -> None:
        """Run `write` only while `fence` holds the workflow's lease: atomically in a transaction if the server
        runs them, else after a check (`LookupError` if the workflow is not stored, `LeaseLostError` if lost)."""
        if fence is None or not await self._runs_transactions(db):
            await self._check_fence(workflow_id, fence)
            await write(None)
            return
        held = True

        async def fenced_write(session: AsyncClientSession) -> None:
            nonlocal held
            touched = await db[JOURNAL_WORKFLOWS].update_one(
                {'_id': workflow_id, **_holds_lease(fence)}, {'$inc': {'fenced_writes': 1}}, session=session
            )
            held = touched.matched_count == 1
            if held:
                await write(session)

        started = db.client.start_session()
        session = await started if inspect.isawaitable(started) else started  # motor's is a coroutine
        async with session:
            await session.with_transaction(fenced_write)
        if not held:
            await self._check_fence(workflow_id, fence)  # says why: not stored, or the lease was lost

    async def _runs_transactions(self, db: Database) -> bool:
        if self._transactions is None:
            hello = await db.command('hello')
            self._transactions = 'setName' in hello or hello.get('msg') == 'isdbgrid'
        return self._transactions

    async def list_units(self, *, workflow_id: str) -> list[DurableUnit]:
        require_text('workflow_id', workflow_id)
        found = [
            document async for document in self._db()[JOURNAL_UNITS].find({'workflow_id': workflow_id}).sort(UNIT_ORDER)
        ]
        return read_each(
            found,
            lambda document: f'durable unit {document.get("unit_key")!r} of workflow {workflow_id!r}',
            _unit_from_document,
        )

    async def delete_workflow(self, *, workflow_id: str) -> None:
        require_text('workflow_id', workflow_id)
        db = self._db()
        await db[JOURNAL_UNITS].delete_many({'workflow_id': workflow_id})
        await db[JOURNAL_WORKFLOWS].delete_one({'_id': workflow_id})
