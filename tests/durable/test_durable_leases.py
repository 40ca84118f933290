"""Leases in one process: a live run's heartbeat keeps its workflow, a lost lease stops the run, a held one is refused.

Processes that crash and are recovered, and two racing to recover one workflow, are in
tests/durable/test_durable_crash.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from step_persistence import InMemoryStepStore, SqliteStepStore, StepStore
from step_persistence.durable import (
    DurableUnit,
    Fence,
    LeaseLostError,
    WorkflowHeldError,
    WorkflowRecord,
    child_workflow_id,
    journal_for,
    recover_abandoned,
)
from step_persistence.durable.fingerprints import inputs_fingerprint
from step_persistence.records import utc_now
from support.backends import BACKENDS
from support.durable_agents import AGENT_NAME, DELEGATE_CALL, Calls, build_agent, build_delegating_agent, wait_until

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=0.3)


@pytest.fixture(params=['file', 'memory', 'mongo', 'postgres', 'sqlite'])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StepStore]:
    async with BACKENDS[request.param].open(request) as session:
        yield await session.make()


async def _workflow(store: StepStore) -> WorkflowRecord:
    workflow = await journal_for(store).get_workflow(workflow_id='order-1')
    assert workflow is not None
    return workflow


def _hold_inside_charge(calls: Calls) -> tuple[asyncio.Event, asyncio.Event]:
    """Make `charge` wait inside its body: (set once it is inside, set to let it return)."""
    inside, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        inside.set()
        await release.wait()

    calls.hooks['charge'] = hold
    return inside, release


async def _inside_charge(store: StepStore, calls: Calls) -> tuple[asyncio.Task[Any], asyncio.Event, WorkflowRecord]:
    """Start the workflow with a short lease and wait until `charge` runs: the run, its release, the workflow."""
    inside, release = _hold_inside_charge(calls)
    run = asyncio.create_task(build_agent(store, calls, lease_duration=LEASE).run('two items', run_id='order-1'))
    await inside.wait()
    return run, release, await _workflow(store)


async def test_a_heartbeat_keeps_a_slow_run_from_being_claimed(store: StepStore) -> None:
    calls = Calls()
    run, release, first = await _inside_charge(store, calls)
    assert first.lease_expires_at is not None and first.owner is not None

    async def renewed_past_two_leases() -> bool:
        current = await _workflow(store)
        assert current.lease_expires_at is not None
        return current.lease_expires_at > first.lease_expires_at + 2 * LEASE  # type: ignore[operator]

    await wait_until(renewed_past_two_leases)  # the run outlived its first lease twice over
    # Looked at as of a time its first lease had long expired and its renewed one had not (a clock of their
    # own: a heartbeat this loaded machine delays after the wait must not decide the test).
    at = first.lease_expires_at + 2 * LEASE
    assert await recover_abandoned(store, agents=[build_agent(store, Calls())], clock=lambda: at) == []
    refused = await journal_for(store).claim_workflow(
        workflow_id='order-1', owner='another process', lease_expires_at=at + LEASE, now=at
    )
    assert refused is not None and (refused.owner, refused.fencing_epoch) == (first.owner, first.fencing_epoch)
    release.set()
    assert (await run).output == 'done: reserve=reserved A-1, charge=charged 1250'
    assert (calls.model, calls.tools['charge']) == (2, 1)
    ended = await _workflow(store)
    assert (ended.status, ended.owner, ended.lease_expires_at) == ('completed', None, None)


async def test_a_run_that_lost_its_lease_stops_at_its_next_unit(store: StepStore) -> None:
    calls = Calls()
    run, release, held = await _inside_charge(store, calls)
    later = utc_now() + timedelta(hours=1)  # another process, whose clock says the lease expired long ago
    taken = await journal_for(store).claim_workflow(
        workflow_id='order-1', owner='another process', lease_expires_at=later + LEASE, now=later
    )
    assert taken is not None and (taken.owner, taken.fencing_epoch) == ('another process', held.fencing_epoch + 1)
    release.set()
    with pytest.raises(LeaseLostError, match='no longer holds its lease'):
        await run
    assert calls.model == 1  # the run stopped: its next model request never ran
    units = {unit.tool_call_id: unit.status for unit in await journal_for(store).list_units(workflow_id='order-1')}
    assert units['call-charge'] == 'started'  # its completion was refused: the new owner decides it
    after = await _workflow(store)
    assert (after.status, after.owner, after.fencing_epoch) == ('running', 'another process', taken.fencing_epoch)


async def test_a_workflow_a_live_run_holds_is_refused() -> None:
    store = InMemoryStepStore()
    calls = Calls()
    inside, release = _hold_inside_charge(calls)
    run = asyncio.create_task(build_agent(store, calls).run('two items', run_id='order-1'))
    await inside.wait()
    second = Calls()
    with pytest.raises(WorkflowHeldError, match="'order-1' is being run by"):
        await build_agent(store, second).run('two items', run_id='order-1')
    assert (second.model, sum(second.tools.values())) == (0, 0)
    release.set()
    await run
    assert (await _workflow(store)).status == 'completed'


async def test_an_expired_lease_is_taken_by_the_next_run() -> None:
    """A lease its holder never released (its process died) is taken by the next run once it expired, not before."""
    store = InMemoryStepStore()
    journal = journal_for(store)
    await build_agent(store, Calls()).run('two items', run_id='order-1')
    expired = utc_now() - timedelta(seconds=1)
    gone = await journal.claim_workflow(
        workflow_id='order-1', owner='gone', lease_expires_at=expired, now=expired - LEASE
    )
    assert gone is not None and gone.owner == 'gone'
    clock_before_expiry = lambda: expired - timedelta(microseconds=1)  # noqa: E731
    with pytest.raises(WorkflowHeldError, match="'gone'"):
        await build_agent(store, Calls(), clock=clock_before_expiry).run('two items', run_id='order-1')
    again = Calls()
    result = await build_agent(store, again).run('two items', run_id='order-1')
    assert result.output == 'done: reserve=reserved A-1, charge=charged 1250'
    assert (again.model, sum(again.tools.values())) == (0, 0)  # replayed
    taken = await _workflow(store)
    assert (taken.fencing_epoch, taken.owner, taken.status) == (gone.fencing_epoch + 1, None, 'completed')


async def test_recovery_skips_what_it_cannot_resume() -> None:
    store = InMemoryStepStore()
    journal = journal_for(store)
    await journal.start_workflow(WorkflowRecord(workflow_id='unknown-agent', agent_name='billing'))
    await journal.start_workflow(WorkflowRecord(workflow_id='history', agent_name=AGENT_NAME, inputs={'prompt': None}))
    inputs = {'prompt': 'two items', 'history': None, 'fingerprint': inputs_fingerprint('two items', [])}
    await journal.start_workflow(
        WorkflowRecord(workflow_id='old-code', agent_name=AGENT_NAME, code_version='v0', inputs=inputs)
    )
    recoveries = await recover_abandoned(store, agents=[build_agent(store, Calls())])
    assert [(each.workflow_id, each.outcome) for each in recoveries] == [
        ('unknown-agent', 'skipped'),
        ('history', 'skipped'),
        ('old-code', 'skipped'),
    ]
    assert "no agent named 'billing'" in (recoveries[0].detail or '')
    assert "started by code version 'v0', and this is None" in (recoveries[2].detail or '')
    for workflow_id in ('unknown-agent', 'history', 'old-code'):
        stored = await journal.get_workflow(workflow_id=workflow_id)
        assert stored is not None and (stored.owner, stored.fencing_epoch) == (None, 0)  # not claimed
    with pytest.raises(ValueError, match='two agents are named'):
        await recover_abandoned(store, agents=[build_agent(store, Calls()), build_agent(store, Calls())])


async def test_recovery_with_agents_journaling_in_another_store_is_refused_before_any_claim(tmp_path: Path) -> None:
    inputs = {'prompt': 'two items', 'history': None, 'fingerprint': inputs_fingerprint('two items', [])}
    store, elsewhere = InMemoryStepStore(), InMemoryStepStore()
    await journal_for(store).start_workflow(WorkflowRecord(workflow_id='order-1', agent_name=AGENT_NAME, inputs=inputs))
    calls = Calls()
    with pytest.raises(ValueError, match='StepDurability journals in another store'):
        await recover_abandoned(store, agents=[build_agent(elsewhere, calls)])
    stored = await _workflow(store)
    assert (stored.status, stored.owner, stored.fencing_epoch, calls.model) == ('running', None, 0, 0)  # not claimed
    assert await journal_for(elsewhere).get_workflow(workflow_id='order-1') is None  # nothing started there
    [recovery] = await recover_abandoned(store, agents=[build_agent(store, calls)])
    assert (recovery.outcome, recovery.output) == ('resumed', 'done: reserve=reserved A-1, charge=charged 1250')

    # Another store object on the same storage journals in it: its agents recover the workflows stored there.
    path = tmp_path / 'orders.db'
    async with SqliteStepStore(path) as recovered, SqliteStepStore(path) as agents_store:
        await journal_for(recovered).start_workflow(
            WorkflowRecord(workflow_id='order-2', agent_name=AGENT_NAME, inputs=inputs)
        )
        [recovery] = await recover_abandoned(recovered, agents=[build_agent(agents_store, Calls())])
        assert (recovery.workflow_id, recovery.outcome) == ('order-2', 'resumed')


async def test_a_lease_expired_by_the_runs_clock_is_renewed_before_its_next_unit() -> None:
    """The heartbeat fell behind (here: the clock jumps past the expiry): the next unit renews the lease first."""
    store = InMemoryStepStore()
    offset = [timedelta(0)]
    calls = Calls()
    inside, release = _hold_inside_charge(calls)
    seen: list[WorkflowRecord] = []

    async def note_the_lease() -> None:
        seen.append(await _workflow(store))

    calls.hooks['model:2'] = note_the_lease
    agent = build_agent(store, calls, lease_duration=timedelta(hours=1), clock=lambda: utc_now() + offset[0])
    run = asyncio.create_task(agent.run('two items', run_id='order-1'))
    await inside.wait()
    before = await _workflow(store)
    offset[0] = timedelta(hours=2)  # past the lease's expiry, by the run's clock
    release.set()
    assert (await run).output == 'done: reserve=reserved A-1, charge=charged 1250'
    [during] = seen
    assert before.lease_expires_at is not None and during.lease_expires_at is not None
    assert during.lease_expires_at - before.lease_expires_at >= timedelta(hours=2)
    assert (during.owner, during.fencing_epoch) == (before.owner, before.fencing_epoch)


async def _child_held_by_a_stale_run(store: StepStore) -> tuple[str, WorkflowRecord, asyncio.Event]:
    """Stop `desk-1` inside its delegate's `charge`, then let a stale run claim the child's lease for an hour: the
    child's id, the stale claim, and the event that lets `charge` finish."""
    orders = Calls()
    inside, release = _hold_inside_charge(orders)
    run = asyncio.create_task(
        build_delegating_agent(store, Calls(), orders, idempotent_b=True).run('desk work', run_id='desk-1')
    )
    await inside.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    child_id = child_workflow_id('desk-1', DELEGATE_CALL)
    now = utc_now()
    stale = await journal_for(store).claim_workflow(
        workflow_id=child_id, owner='stale run', lease_expires_at=now + timedelta(hours=1), now=now
    )
    assert stale is not None and stale.owner == 'stale run'
    return child_id, stale, release


async def test_a_resumed_parent_takes_over_its_childs_lease(store: StepStore) -> None:
    """A child workflow's lease held by a stale run (the dead process renewed it after its parent's) is taken over by
    the parent that holds its own lease and runs the delegating tool again; the new epoch fences the stale run."""
    journal = journal_for(store)
    child_id, stale, release = await _child_held_by_a_stale_run(store)
    release.set()
    again = build_delegating_agent(store, Calls(), Calls(), idempotent_b=True)
    result = await again.run('desk work', run_id='desk-1')
    assert result.output == 'desk: delegate=done: reserve=reserved A-1, charge=charged 1250'
    child = await journal.get_workflow(workflow_id=child_id)
    assert child is not None and (child.status, child.fencing_epoch) == ('completed', stale.fencing_epoch + 1)
    with pytest.raises(LeaseLostError):
        await journal.end_workflow(
            workflow_id=child_id, status='failed', fence=Fence(owner='stale run', epoch=stale.fencing_epoch)
        )


class _StaleRunRenewing(InMemoryStepStore):
    """A memory store in which a stale run renews its lease on workflow `held[0]` (fence `held[1]`) whenever that
    workflow is read, as its heartbeat may at any moment."""

    held: tuple[str, Fence] | None = None

    async def get_workflow(self, *, workflow_id: str) -> WorkflowRecord | None:
        found = await super().get_workflow(workflow_id=workflow_id)
        if self.held is not None and self.held[0] == workflow_id:
            renewed_until = utc_now() + timedelta(hours=2)
            await self.renew_lease(workflow_id=workflow_id, fence=self.held[1], lease_expires_at=renewed_until)
        return found


async def test_a_take_over_wins_over_a_stale_run_renewing_the_childs_lease() -> None:
    store = _StaleRunRenewing()
    journal = journal_for(store)
    child_id, stale, release = await _child_held_by_a_stale_run(store)
    store.held = (child_id, Fence(owner='stale run', epoch=stale.fencing_epoch))
    release.set()
    result = await build_delegating_agent(store, Calls(), Calls(), idempotent_b=True).run('desk work', run_id='desk-1')
    assert result.output == 'desk: delegate=done: reserve=reserved A-1, charge=charged 1250'
    child = await journal.get_workflow(workflow_id=child_id)
    assert child is not None and (child.status, child.fencing_epoch) == ('completed', stale.fencing_epoch + 1)


class _StaleRunStartingFirst(InMemoryStepStore):
    """A memory store in which a stale run's first start of workflow `raced`, holding its lease, lands just before
    the first start of it that this store is asked for."""

    raced: str | None = None

    async def start_workflow(self, record: WorkflowRecord) -> WorkflowRecord:
        if record.workflow_id == self.raced:
            self.raced = None
            held = {'owner': 'stale run', 'lease_expires_at': utc_now() + timedelta(hours=1), 'fencing_epoch': 1}
            await super().start_workflow(record.model_copy(update=held))
        return await super().start_workflow(record)


async def test_a_take_over_wins_over_a_stale_runs_first_start_of_the_child() -> None:
    store = _StaleRunStartingFirst()
    journal = journal_for(store)
    child_id = child_workflow_id('desk-1', DELEGATE_CALL)
    store.raced = child_id
    result = await build_delegating_agent(store, Calls(), Calls(), idempotent_b=True).run('desk work', run_id='desk-1')
    assert result.output == 'desk: delegate=done: reserve=reserved A-1, charge=charged 1250'
    child = await journal.get_workflow(workflow_id=child_id)
    assert child is not None and (child.status, child.fencing_epoch, child.attempts) == ('completed', 2, 2)
    with pytest.raises(LeaseLostError):
        await journal.record_unit(
            DurableUnit(workflow_id=child_id, unit_key='stale#run#0', name='stale', kind='other', status='started'),
            fence=Fence(owner='stale run', epoch=1),
        )
