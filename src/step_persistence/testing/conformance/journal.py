"""The durable journal (`JournalStore`): workflows, units, the finality of a completed unit, leases and fencing.

Not part of `StepStoreConformance`: a store that holds a journal (see
`step_persistence.durable.journals.journal_for`) runs this mixin as well, with the same
`make_store` fixture.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from step_persistence.durable.errors import LeaseLostError
from step_persistence.durable.journals import journal_for
from step_persistence.durable.protocol import JournalStore
from step_persistence.durable.records import DurableUnit, Fence, WorkflowRecord
from step_persistence.testing.conformance.shared import T0, ConformanceBase, StoreFactory

__all__ = ['JournalConformance']

RESULT: Any = {'kind': 'tool_return', 'value': {'items': [1, 2.5, None, 'ü ✓'], 'empty': {}, 'flag': False}}


def _workflow(workflow_id: str = 'wf', **fields: Any) -> WorkflowRecord:
    values: dict[str, Any] = {
        'workflow_id': workflow_id,
        'agent_name': 'agent',
        'run_id': workflow_id,
        'code_version': 'v1',
        'inputs': {'prompt': 'hello ✓', 'fingerprint': 'abc'},
        'created_at': T0,
        'updated_at': T0,
        **fields,
    }
    return WorkflowRecord.model_validate(values)


def _unit(key: str, status: str = 'started', *, workflow_id: str = 'wf', offset: int = 0, **fields: Any) -> DurableUnit:
    values: dict[str, Any] = {
        'workflow_id': workflow_id,
        'unit_key': key,
        'name': 'agent__model.request',
        'kind': 'model',
        'status': status,
        'fingerprint': 'f-' + key,
        'started_at': T0 + timedelta(seconds=offset),
        **fields,
    }
    return DurableUnit.model_validate(values)


LEASE = timedelta(seconds=30)


async def _claim(
    journal: JournalStore, owner: str, *, at: timedelta = timedelta(0), workflow_id: str = 'wf', **options: Any
) -> WorkflowRecord | None:
    """Claim `workflow_id` for `owner` at `T0 + at`, for `LEASE`."""
    now = T0 + at
    return await journal.claim_workflow(
        workflow_id=workflow_id, owner=owner, lease_expires_at=now + LEASE, now=now, **options
    )


class JournalConformance(ConformanceBase):
    """What every durable journal must do."""

    @pytest.fixture
    async def journal(self, make_store: StoreFactory) -> JournalStore:
        return journal_for(await make_store())

    async def test_a_workflow_round_trips(self, journal: JournalStore) -> None:
        record = _workflow()
        assert await journal.start_workflow(record) == record
        assert await journal.get_workflow(workflow_id='wf') == record
        assert await journal.get_workflow(workflow_id='other') is None

    async def test_the_first_start_wins_and_later_starts_count_attempts(self, journal: JournalStore) -> None:
        first = _workflow()
        await journal.start_workflow(first)
        await journal.end_workflow(workflow_id='wf', status='failed')
        later = _workflow(code_version='v2', inputs={'prompt': 'other'}, updated_at=T0 + timedelta(hours=1))
        again = await journal.start_workflow(later)
        assert again == first.model_copy(update={'attempts': 2, 'status': 'running', 'updated_at': later.updated_at})
        assert await journal.get_workflow(workflow_id='wf') == again

    async def test_concurrent_starts_store_one_workflow(self, journal: JournalStore) -> None:
        records = [_workflow(code_version=f'v{n}') for n in range(5)]
        started = await asyncio.gather(*(journal.start_workflow(record) for record in records))
        assert len({record.code_version for record in started}) == 1
        assert sorted(record.attempts for record in started) == [1, 2, 3, 4, 5]

    async def test_ending_a_workflow_sets_its_status(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await journal.end_workflow(workflow_id='wf', status='completed')
        stored = await journal.get_workflow(workflow_id='wf')
        assert stored is not None and stored.status == 'completed'
        with pytest.raises(LookupError):
            await journal.end_workflow(workflow_id='missing', status='completed')

    async def test_a_unit_goes_from_started_to_completed_with_its_result(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        tool: dict[str, Any] = {
            'kind': 'tool',
            'name': 'agent__function_toolset__tools.call_tool:send',
            'tool_call_id': 'call-1',
        }
        started = _unit('u1', **tool)
        await journal.record_unit(started)
        assert await journal.list_units(workflow_id='wf') == [started]
        completed = _unit('u1', 'completed', result=RESULT, ended_at=T0 + timedelta(seconds=1), **tool)
        await journal.record_unit(completed)
        assert await journal.list_units(workflow_id='wf') == [completed]

    async def test_a_result_with_media_markers_says_so(self, journal: JournalStore) -> None:
        """`externalized` (the result's media is in the media store) is stored with the result, never guessed."""
        await journal.start_workflow(_workflow())
        marker = {'$step_persistence.media': {'v': 1, 'uri': 'media://sha256/ab', 'encoding': 'utf-8'}}
        externalized = _unit('u1', 'completed', result=[marker], externalized=True, ended_at=T0)
        inline = _unit('u2', 'completed', offset=1, result=[marker], ended_at=T0)
        await journal.record_unit(externalized)
        await journal.record_unit(inline)
        assert await journal.list_units(workflow_id='wf') == [externalized, inline]
        assert not inline.externalized

    async def test_a_completed_unit_is_final(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        completed = _unit('u1', 'completed', result=None, ended_at=T0)
        await journal.record_unit(_unit('u1'))
        await journal.record_unit(completed)
        await journal.record_unit(_unit('u1', offset=5))
        await journal.record_unit(_unit('u1', 'failed', error='late', ended_at=T0))
        assert await journal.list_units(workflow_id='wf') == [completed]

    async def test_a_started_unit_started_again_counts_an_attempt(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await journal.record_unit(_unit('u1'))
        await journal.record_unit(_unit('u1', 'failed', error='boom ✓', ended_at=T0 + timedelta(seconds=1)))
        [failed] = await journal.list_units(workflow_id='wf')
        assert (failed.status, failed.error, failed.attempts) == ('failed', 'boom ✓', 1)
        await journal.record_unit(_unit('u1', offset=10))
        await journal.record_unit(_unit('u1', 'completed', offset=10, result=RESULT, ended_at=T0))
        [completed] = await journal.list_units(workflow_id='wf')
        assert (completed.status, completed.attempts, completed.result) == ('completed', 2, RESULT)
        assert completed.started_at == T0 + timedelta(seconds=10)
        assert completed.error is None

    async def test_units_list_in_start_order_per_workflow(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await journal.start_workflow(_workflow('other'))
        for key, offset in [('late', 30), ('early', -30), ('b-tie', 0), ('a-tie', 0)]:
            await journal.record_unit(_unit(key, offset=offset))
        await journal.record_unit(_unit('elsewhere', workflow_id='other'))
        assert [unit.unit_key for unit in await journal.list_units(workflow_id='wf')] == [
            'early',
            'a-tie',
            'b-tie',
            'late',
        ]
        assert [unit.unit_key for unit in await journal.list_units(workflow_id='other')] == ['elsewhere']
        assert await journal.list_units(workflow_id='missing') == []

    async def test_a_unit_of_a_workflow_not_stored_is_refused(self, journal: JournalStore) -> None:
        with pytest.raises(LookupError):
            await journal.record_unit(_unit('u1', workflow_id='missing'))
        assert await journal.list_units(workflow_id='missing') == []

    async def test_deleting_a_workflow_removes_its_units_only(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await journal.start_workflow(_workflow('kept'))
        await journal.record_unit(_unit('u1'))
        await journal.record_unit(_unit('u1', workflow_id='kept'))
        await journal.delete_workflow(workflow_id='wf')
        await journal.delete_workflow(workflow_id='missing')
        assert await journal.get_workflow(workflow_id='wf') is None
        assert await journal.list_units(workflow_id='wf') == []
        assert [unit.workflow_id for unit in await journal.list_units(workflow_id='kept')] == ['kept']
        await journal.start_workflow(_workflow())
        assert await journal.list_units(workflow_id='wf') == []

    async def test_a_claim_takes_a_free_lease_and_bumps_the_epoch(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        claimed = await _claim(journal, 'process-a ✓')
        assert claimed is not None
        assert (claimed.owner, claimed.lease_expires_at, claimed.fencing_epoch) == ('process-a ✓', T0 + LEASE, 1)
        assert (claimed.attempts, claimed.status, claimed.inputs) == (1, 'running', _workflow().inputs)
        assert await journal.get_workflow(workflow_id='wf') == claimed
        assert await _claim(journal, 'a', workflow_id='missing') is None

    async def test_a_claim_refuses_an_owner_that_is_not_text(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        with pytest.raises(TypeError, match='owner'):
            await _claim(journal, 7)  # type: ignore[arg-type]
        stored = await journal.get_workflow(workflow_id='wf')
        assert stored is not None and (stored.owner, stored.fencing_epoch) == (None, 0), 'nothing was claimed'

    async def test_a_held_lease_is_refused_until_it_expires(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await _claim(journal, 'a')
        refused = await _claim(journal, 'b', at=LEASE - timedelta(microseconds=1))
        assert refused is not None and (refused.owner, refused.fencing_epoch) == ('a', 1)
        taken = await _claim(journal, 'b', at=LEASE)
        assert taken is not None and (taken.owner, taken.fencing_epoch) == ('b', 2)
        assert taken.lease_expires_at == T0 + 2 * LEASE

    async def test_one_of_concurrent_claims_wins(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        results = await asyncio.gather(*(_claim(journal, f'owner-{n}') for n in range(5)))
        winners = {record.owner for record in results if record is not None}
        assert len(winners) == 1
        stored = await journal.get_workflow(workflow_id='wf')
        assert stored is not None and stored.owner in winners and stored.fencing_epoch == 1

    async def test_a_running_only_claim_refuses_an_ended_workflow(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await journal.end_workflow(workflow_id='wf', status='completed')
        refused = await _claim(journal, 'a', running_only=True)
        assert refused is not None and (refused.owner, refused.fencing_epoch) == (None, 0)
        refused = await _claim(journal, 'a', running_only=True, take_over=True)
        assert refused is not None and (refused.owner, refused.fencing_epoch) == (None, 0)
        claimed = await _claim(journal, 'a')
        assert claimed is not None and claimed.owner == 'a'

    async def test_a_take_over_claims_a_held_lease_and_fences_its_holder(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await _claim(journal, 'a')
        stale = Fence(owner='a', epoch=1)
        await journal.record_unit(_unit('u1'), fence=stale)
        taken = await _claim(journal, 'b', take_over=True)  # at T0, while 'a' holds the lease until T0 + LEASE
        assert taken is not None
        assert (taken.owner, taken.lease_expires_at, taken.fencing_epoch) == ('b', T0 + LEASE, 2)
        assert (taken.attempts, taken.status, taken.inputs) == (1, 'running', _workflow().inputs)
        assert await journal.get_workflow(workflow_id='wf') == taken
        assert not await journal.renew_lease(workflow_id='wf', fence=stale, lease_expires_at=T0 + 2 * LEASE)
        with pytest.raises(LeaseLostError, match="'a'"):
            await journal.record_unit(_unit('u1', 'completed', result=RESULT, ended_at=T0), fence=stale)
        with pytest.raises(LeaseLostError):
            await journal.record_unit(_unit('u2'), fence=stale)
        with pytest.raises(LeaseLostError):
            await journal.end_workflow(workflow_id='wf', status='failed', fence=stale)
        assert await journal.list_units(workflow_id='wf') == [_unit('u1')]
        assert await journal.get_workflow(workflow_id='wf') == taken
        holder = Fence(owner='b', epoch=2)
        assert await journal.renew_lease(workflow_id='wf', fence=holder, lease_expires_at=T0 + 2 * LEASE)
        await journal.record_unit(_unit('u1', 'completed', result=RESULT, ended_at=T0), fence=holder)
        [completed] = await journal.list_units(workflow_id='wf')
        assert completed.status == 'completed'
        assert await _claim(journal, 'c', workflow_id='missing', take_over=True) is None

    async def test_concurrent_take_overs_each_raise_the_epoch(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await _claim(journal, 'a')
        results = await asyncio.gather(*(_claim(journal, f'owner-{n}', take_over=True) for n in range(5)))
        assert [None if record is None else record.owner for record in results] == [f'owner-{n}' for n in range(5)]
        taken = sorted((record.fencing_epoch, record.owner) for record in results if record is not None)
        assert [epoch for epoch, _ in taken] == [2, 3, 4, 5, 6]
        stored = await journal.get_workflow(workflow_id='wf')
        assert stored is not None and (stored.fencing_epoch, stored.owner) == taken[-1]

    async def test_only_the_holder_renews_its_lease(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await _claim(journal, 'a')
        later = T0 + 2 * LEASE
        assert not await journal.renew_lease(workflow_id='wf', fence=Fence(owner='b', epoch=1), lease_expires_at=later)
        assert not await journal.renew_lease(workflow_id='wf', fence=Fence(owner='a', epoch=0), lease_expires_at=later)
        assert not await journal.renew_lease(
            workflow_id='missing', fence=Fence(owner='a', epoch=1), lease_expires_at=later
        )
        stored = await journal.get_workflow(workflow_id='wf')
        assert stored is not None and stored.lease_expires_at == T0 + LEASE
        assert await journal.renew_lease(workflow_id='wf', fence=Fence(owner='a', epoch=1), lease_expires_at=later)
        stored = await journal.get_workflow(workflow_id='wf')
        assert stored is not None and (stored.owner, stored.lease_expires_at, stored.fencing_epoch) == ('a', later, 1)
        refused = await _claim(journal, 'b', at=LEASE)
        assert refused is not None and refused.owner == 'a'

    async def test_a_stale_owners_writes_are_refused(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await _claim(journal, 'a')
        stale = Fence(owner='a', epoch=1)
        await journal.record_unit(_unit('u1'), fence=stale)
        await _claim(journal, 'b', at=LEASE)
        with pytest.raises(LeaseLostError, match="'a'"):
            await journal.record_unit(_unit('u1', 'completed', result=RESULT, ended_at=T0), fence=stale)
        with pytest.raises(LeaseLostError):
            await journal.record_unit(_unit('u2'), fence=stale)
        with pytest.raises(LeaseLostError):
            await journal.end_workflow(workflow_id='wf', status='completed', fence=stale)
        assert not await journal.renew_lease(workflow_id='wf', fence=stale, lease_expires_at=T0 + 3 * LEASE)
        assert await journal.list_units(workflow_id='wf') == [_unit('u1')]
        stored = await journal.get_workflow(workflow_id='wf')
        assert stored is not None and (stored.status, stored.owner, stored.fencing_epoch) == ('running', 'b', 2)
        holder = Fence(owner='b', epoch=2)
        await journal.record_unit(_unit('u1', 'completed', result=RESULT, ended_at=T0), fence=holder)
        [completed] = await journal.list_units(workflow_id='wf')
        assert completed.status == 'completed'
        with pytest.raises(LookupError):
            await journal.record_unit(_unit('u1', workflow_id='missing'), fence=holder)

    async def test_ending_a_workflow_releases_its_lease(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        await _claim(journal, 'a')
        await journal.end_workflow(workflow_id='wf', status='failed', fence=Fence(owner='a', epoch=1))
        stored = await journal.get_workflow(workflow_id='wf')
        assert stored is not None and (stored.status, stored.owner, stored.lease_expires_at) == ('failed', None, None)
        again = await _claim(journal, 'b')  # free at once, before the old expiry
        assert again is not None and (again.owner, again.fencing_epoch) == ('b', 2)

    async def test_a_later_start_keeps_the_lease(self, journal: JournalStore) -> None:
        await journal.start_workflow(_workflow())
        claimed = await _claim(journal, 'a')
        again = await journal.start_workflow(_workflow(owner='b', fencing_epoch=7))
        assert claimed is not None and again.attempts == 2
        assert (again.owner, again.lease_expires_at, again.fencing_epoch) == ('a', T0 + LEASE, 1)

    async def test_abandoned_workflows_are_running_ones_with_a_free_lease(self, journal: JournalStore) -> None:
        for workflow_id, minutes in [('held', 0), ('expired', 1), ('never-claimed', 2), ('done', 3)]:
            await journal.start_workflow(_workflow(workflow_id, updated_at=T0 + timedelta(minutes=minutes)))
        await _claim(journal, 'a', workflow_id='held', at=LEASE)
        await _claim(journal, 'a', workflow_id='expired')
        await journal.end_workflow(workflow_id='done', status='completed')
        found = await journal.list_abandoned(now=T0 + LEASE)
        assert [record.workflow_id for record in found] == ['expired', 'never-claimed']  # the claim updated it
        assert await journal.list_abandoned(now=T0 + LEASE - timedelta(microseconds=1)) == [
            record for record in found if record.workflow_id == 'never-claimed'
        ]
