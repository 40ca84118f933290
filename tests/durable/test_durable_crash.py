"""A process killed (`os._exit`) in the middle of a durable run; a fresh process resumes it.

The calls file (appended to by every model request and tool body, in every process) proves what
ran again: only the unit that was in flight and the units after it. The killed process held its
workflow's lease (half a second here), so a fresh process resumes it once that lease has expired:
by running it again, or with `recover_abandoned`, also in two processes racing to recover it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from step_persistence import from_spec
from step_persistence.durable import child_workflow_id, journal_for
from step_persistence.records import utc_now
from support.backends import BACKENDS, BackendSession, spec_of
from support.durable_agents import DELEGATE_CALL
from support.durable_child import CRASH_STATUS

pytestmark = pytest.mark.anyio

CHILD = Path(__file__).parents[1] / 'support' / 'durable_child.py'
TESTS = Path(__file__).parents[1]


@pytest.fixture(params=['file', 'mongo', 'postgres', 'sqlite'])
async def session(request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    async with BACKENDS[request.param].open(request) as opened:
        yield opened


LEASE_SECONDS = 0.5
WAIT_LIMIT = 2000
"""Rounds of polling (5 ms each, plus each round's read) before a wait fails."""


async def _run_child(session: BackendSession, calls: Path, *, crash_at: str | None, **options: Any) -> tuple[int, Any]:
    """Run the child; its exit status and, if it exited 0, what it printed (decoded)."""
    arguments = {
        'spec': spec_of(session),
        'run_id': 'order-42',
        'calls': str(calls),
        'crash_at': crash_at,
        'idempotent_b': True,
        'lease_seconds': LEASE_SECONDS,
        **options,
    }
    command = [sys.executable, str(CHILD), json.dumps(arguments)]

    def run() -> subprocess.CompletedProcess[str]:
        env = {**os.environ, 'PYTHONPATH': str(TESTS)}
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)

    completed = await anyio.to_thread.run_sync(run)
    assert completed.returncode in (0, CRASH_STATUS), completed.stderr
    return completed.returncode, json.loads(completed.stdout) if completed.returncode == 0 else None


OUTPUT = 'done: reserve=reserved A-1, charge=charged 1250'


async def _child(session: BackendSession, calls: Path, *, crash_at: str | None, **options: Any) -> int:
    """Run the workflow in a child (resuming it once the crashed run's lease expired); its exit status."""
    if crash_at is None:
        await _lease_expired(session)
    status, output = await _run_child(session, calls, crash_at=crash_at, **options)
    if status == 0:
        assert output == (f'desk: delegate={OUTPUT}' if options.get('delegate') else OUTPUT)
    return status


async def _lease_expired(session: BackendSession) -> None:
    """Wait until the lease of the stored workflow (if any) expired or was released."""
    async with from_spec(**spec_of(session)) as store:
        journal = journal_for(store)
        for _ in range(WAIT_LIMIT):
            workflow = await journal.get_workflow(workflow_id='order-42')
            if workflow is None or workflow.lease_expires_at is None or workflow.lease_expires_at <= utc_now():
                return
            await asyncio.sleep(0.005)
    raise AssertionError('the lease never expired')


def _ran(calls: Path) -> Counter[str]:
    return Counter(calls.read_text().split())


async def _check_one_record(session: BackendSession) -> None:
    async with from_spec(**spec_of(session)) as store:
        assert [run.run_id for run in await store.list_runs()] == ['order-42']
        effects = {effect.tool_call_id: effect.status for effect in await store.list_tool_effects(run_id='order-42')}
        assert effects == {'call-reserve': 'completed', 'call-charge': 'completed'}
        kinds = Counter(event.kind for event in await store.list_events(run_id='order-42'))
        assert (kinds['run_started'], kinds['run_completed'], kinds['run_failed']) == (1, 1, 0)
        workflow = await journal_for(store).get_workflow(workflow_id='order-42')
        assert workflow is not None and (workflow.status, workflow.attempts) == ('completed', 2)


async def test_killed_inside_a_tool_of_a_parallel_batch(session: BackendSession, tmp_path: Path) -> None:
    calls = tmp_path / 'calls.txt'
    assert await _child(session, calls, crash_at='charge') == CRASH_STATUS
    assert _ran(calls) == {'model': 1, 'reserve': 1, 'charge': 1}
    assert await _child(session, calls, crash_at=None) == 0
    # Resumed: the first request and the completed sibling replayed; the call in flight and the last request ran.
    assert _ran(calls) == {'model': 2, 'reserve': 1, 'charge': 2}
    await _check_one_record(session)


async def test_killed_during_a_model_request(session: BackendSession, tmp_path: Path) -> None:
    calls = tmp_path / 'calls.txt'
    assert await _child(session, calls, crash_at='model:2') == CRASH_STATUS
    assert _ran(calls) == {'model': 2, 'reserve': 1, 'charge': 1}
    assert await _child(session, calls, crash_at=None) == 0
    assert _ran(calls) == {'model': 3, 'reserve': 1, 'charge': 1}
    await _check_one_record(session)


async def test_killed_between_a_tools_body_and_its_record(session: BackendSession, tmp_path: Path) -> None:
    """The charge happened but its unit was never journaled `completed`: at least once, it runs again."""
    calls = tmp_path / 'calls.txt'
    assert await _child(session, calls, crash_at='record:charge') == CRASH_STATUS
    assert _ran(calls) == {'model': 1, 'reserve': 1, 'charge': 1}
    assert await _child(session, calls, crash_at=None) == 0
    assert _ran(calls) == {'model': 2, 'reserve': 1, 'charge': 2}
    await _check_one_record(session)
    async with from_spec(**spec_of(session)) as store:
        units = {unit.tool_call_id: unit for unit in await journal_for(store).list_units(workflow_id='order-42')}
        assert (units['call-charge'].attempts, units['call-reserve'].attempts) == (2, 1)


async def test_killed_inside_a_delegates_tool(session: BackendSession, tmp_path: Path) -> None:
    """The delegate is a child workflow: the resumed parent replays its first request and runs its tool again,
    in which the delegate replays its own first request and completed call and runs the rest."""
    calls = tmp_path / 'calls.txt'
    assert await _child(session, calls, crash_at='charge', delegate=True) == CRASH_STATUS
    assert _ran(calls) == {'desk-model': 1, 'model': 1, 'reserve': 1, 'charge': 1}
    assert await _child(session, calls, crash_at=None, delegate=True) == 0
    assert _ran(calls) == {'desk-model': 2, 'model': 2, 'reserve': 1, 'charge': 2}
    child_id = child_workflow_id('order-42', DELEGATE_CALL)
    async with from_spec(**spec_of(session)) as store:
        journal = journal_for(store)
        for workflow_id in ('order-42', child_id):
            workflow = await journal.get_workflow(workflow_id=workflow_id)
            assert workflow is not None and (workflow.status, workflow.attempts) == ('completed', 2)
        units = await journal.list_units(workflow_id=child_id)
        attempts = {unit.tool_call_id: unit.attempts for unit in units if unit.kind == 'tool'}
        assert attempts == {'call-reserve': 1, 'call-charge': 2}
        assert {run.run_id: run.parent_run_id for run in await store.list_runs()} == {
            'order-42': None,
            child_id: 'order-42',
        }


async def test_a_crashed_run_is_recovered_once_its_lease_expires(session: BackendSession, tmp_path: Path) -> None:
    calls = tmp_path / 'calls.txt'
    assert await _child(session, calls, crash_at='charge') == CRASH_STATUS
    async with from_spec(**spec_of(session)) as store:
        journal = journal_for(store)
        crashed = await journal.get_workflow(workflow_id='order-42')
        assert crashed is not None and crashed.status == 'running' and crashed.lease_expires_at is not None
        expiry = crashed.lease_expires_at
        assert await journal.list_abandoned(now=expiry - timedelta(microseconds=1)) == []  # still held
        assert [each.workflow_id for each in await journal.list_abandoned(now=expiry)] == ['order-42']
    await _lease_expired(session)
    status, recoveries = await _run_child(session, calls, crash_at=None, recover=True)
    assert (status, recoveries) == (0, [['order-42', 'resumed', OUTPUT]])
    assert _ran(calls) == {'model': 2, 'reserve': 1, 'charge': 2}
    await _check_one_record(session)
    status, recoveries = await _run_child(session, calls, crash_at=None, recover=True)
    assert (status, recoveries) == (0, [])  # nothing is abandoned any more


async def test_two_processes_racing_to_recover_one_workflow(session: BackendSession, tmp_path: Path) -> None:
    """Both start recovering together once the lease expired: exactly one resumes the workflow."""
    calls = tmp_path / 'calls.txt'
    barrier = tmp_path / 'barrier'
    barrier.mkdir()
    assert await _child(session, calls, crash_at='charge') == CRASH_STATUS
    await _lease_expired(session)

    async def say_go_once_both_are_ready() -> None:
        for _ in range(12000):
            if len(list(barrier.glob('ready-*'))) == 2:
                (barrier / 'go').touch()
                return
            await asyncio.sleep(0.005)
        raise AssertionError('the recovering processes never got ready')

    racing = [_run_child(session, calls, crash_at=None, recover=True, barrier=str(barrier)) for _ in range(2)]
    *results, _ = await asyncio.gather(*racing, say_go_once_both_are_ready())
    assert [status for status, _ in results] == [0, 0]
    outcomes = sorted(outcome for _, recoveries in results for _, outcome, _ in recoveries)
    assert outcomes in (['resumed'], ['resumed', 'taken'])
    # One process resumed it: the call in flight and the last request ran once more, not twice.
    assert _ran(calls) == {'model': 2, 'reserve': 1, 'charge': 2}
    await _check_one_record(session)


@pytest.mark.parametrize('session', ['file', 'sqlite'], indirect=True)
async def test_a_crashed_delegating_run_is_recovered_with_its_child(session: BackendSession, tmp_path: Path) -> None:
    """Recovery resumes the parent, whose tool re-enters the child (taking over the child's lease, which the dead
    process may have renewed after the parent's); the child's own workflow is left to its parent."""
    calls = tmp_path / 'calls.txt'
    assert await _child(session, calls, crash_at='charge', delegate=True) == CRASH_STATUS
    await _lease_expired(session)
    status, recoveries = await _run_child(session, calls, crash_at=None, recover=True, delegate=True)
    assert status == 0
    child_id = child_workflow_id('order-42', DELEGATE_CALL)
    assert {workflow_id: (outcome, output) for workflow_id, outcome, output in recoveries} == {
        'order-42': ('resumed', f'desk: delegate={OUTPUT}'),
        child_id: ('skipped', None),
    }
    assert _ran(calls) == {'desk-model': 2, 'model': 2, 'reserve': 1, 'charge': 2}
    async with from_spec(**spec_of(session)) as store:
        for workflow_id in ('order-42', child_id):
            workflow = await journal_for(store).get_workflow(workflow_id=workflow_id)
            assert workflow is not None and (workflow.status, workflow.owner) == ('completed', None)
