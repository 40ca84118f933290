"""The Mongo journal's fenced unit write: one transaction with its lease check on a server that runs them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from step_persistence.durable.errors import LeaseLostError
from step_persistence.durable.records import DurableUnit, Fence, WorkflowRecord
from step_persistence.records import utc_now
from step_persistence.stores.mongo import MongoStepStore
from step_persistence.stores.mongo.journal import MongoJournal, _unit_id
from support.durable_agents import wait_until
from support.mongo_helpers import CommandLog, scratch
from support.servers.mongo import MongoServer, Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio


async def test_a_fenced_unit_write_is_one_transaction_with_its_lease_check(
    mongo_server: MongoServer, scratch: Scratch
) -> None:
    """The lease check (a write of the workflow's document, filtered on the fence) and the unit's write
    go in one transaction, committed together: a claim, which writes the same document, cannot land
    between them. SecantusDB, the test server, is a single-node replica set."""
    log = CommandLog()
    client = log.client(mongo_server.uri)
    try:
        journal = MongoJournal(MongoStepStore(client=client, database=scratch.fresh_database()))
        now = utc_now()
        await journal.start_workflow(
            WorkflowRecord(workflow_id='wf', owner='a', lease_expires_at=now + timedelta(seconds=30), fencing_epoch=1)
        )
        unit = DurableUnit(workflow_id='wf', unit_key='u#0#0', name='u', kind='tool', status='started')
        log.commands.clear()
        await journal.record_unit(unit, fence=Fence(owner='a', epoch=1))
        sent = [(name, command) for name, _, command in log.commands if name in ('update', 'commitTransaction')]
        assert [name for name, _ in sent] == ['update', 'update', 'commitTransaction']
        assert [command.get(name) for name, command in sent[:2]] == ['durable_workflows', 'durable_units']
        assert {(command['lsid']['id'], command['txnNumber']) for _, command in sent} == {
            (sent[0][1]['lsid']['id'], sent[0][1]['txnNumber'])
        }
        assert sent[0][1].get('startTransaction') is True

        claimed = await journal.claim_workflow(
            workflow_id='wf', owner='b', lease_expires_at=now + timedelta(seconds=90), now=now + timedelta(seconds=60)
        )
        assert claimed is not None and claimed.fencing_epoch == 2
        with pytest.raises(LeaseLostError):
            await journal.record_unit(unit.model_copy(update={'unit_key': 'v#0#0'}), fence=Fence(owner='a', epoch=1))
        assert [stored.unit_key for stored in await journal.list_units(workflow_id='wf')] == ['u#0#0']
    finally:
        await client.close()


async def test_a_claim_during_a_fenced_write_refuses_it(mongo_server: MongoServer, scratch: Scratch) -> None:
    """The stale owner's unit write is held up (another transaction holds the unit's document) until a claim
    has landed: the write is then refused, not let through as a check made before the claim would let it."""
    log = CommandLog()
    stale_client = log.client(mongo_server.uri)
    database = scratch.fresh_database()
    try:
        stale = MongoJournal(MongoStepStore(client=stale_client, database=database))
        claimer = MongoJournal(MongoStepStore(client=scratch.client, database=database))
        now = utc_now()
        await claimer.start_workflow(
            WorkflowRecord(workflow_id='wf', owner='a', lease_expires_at=now + timedelta(seconds=30), fencing_epoch=1)
        )
        units = scratch.client[database]['durable_units']
        async with scratch.client.start_session() as blocker:
            await blocker.start_transaction()
            await units.insert_one({'_id': _unit_id('wf', 'u#0#0'), 'blocked': True}, session=blocker)
            unit = DurableUnit(workflow_id='wf', unit_key='u#0#0', name='u', kind='tool', status='started')
            writing = asyncio.ensure_future(stale.record_unit(unit, fence=Fence(owner='a', epoch=1)))

            async def unit_write_sent() -> bool:
                return any(name == 'update' and collection == 'durable_units' for name, collection, _ in log.commands)

            await wait_until(unit_write_sent)
            claimed = await claimer.claim_workflow(
                workflow_id='wf',
                owner='b',
                lease_expires_at=now + timedelta(seconds=90),
                now=now + timedelta(seconds=60),
            )
            assert claimed is not None and (claimed.owner, claimed.fencing_epoch) == ('b', 2)
            await blocker.abort_transaction()
        with pytest.raises(LeaseLostError):
            await writing
        assert await stale.list_units(workflow_id='wf') == []
    finally:
        await stale_client.close()
