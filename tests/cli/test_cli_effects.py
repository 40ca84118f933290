"""Tool effects across runs and settling one by hand: `find_tool_effects`, `resolve_tool_effect`, and the
`runs resolve` / `runs delete` commands (issue 18, item 13).

The library functions go through the protocol only, so they run against every backend.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

import step_persistence
from step_persistence import RunRecord, StepEvent, StepStore, ToolEffectRecord, from_spec
from step_persistence.records import utc_now
from step_persistence.status import run_status
from support.backends import StoreMaker
from support.console_script import cli

pytestmark = pytest.mark.anyio


async def started_call(
    store: StepStore, run_id: str, call_id: str, *, key: str | None = None, step: int = 1, status: str = 'started'
) -> None:
    await store.record_tool_effect(
        ToolEffectRecord(
            run_id=run_id,
            tool_call_id=call_id,
            tool_name='charge_card',
            status=status,  # type: ignore[arg-type]
            idempotency_key=key,
        )
    )
    await store.append_event(
        StepEvent(
            run_id=run_id,
            kind='tool_call_started',
            step_index=step,
            tool_call_id=call_id,
            tool_name='charge_card',
        )
    )


async def test_find_tool_effects_looks_in_every_run(make_store: StoreMaker) -> None:
    store = await make_store()
    for run_id, conversation in (('first', 'orders-42'), ('second', 'orders-42'), ('other', 'orders-43')):
        await store.register_run(RunRecord(run_id=run_id, conversation_id=conversation))
    await started_call(store, 'first', 'call-1', key='charge::42', status='completed')
    await started_call(store, 'first', 'call-2')
    await started_call(store, 'second', 'call-3', key='charge::42')
    await started_call(store, 'other', 'call-4', key='charge::43')

    found = await step_persistence.find_tool_effects(store, idempotency_key='charge::42')
    assert [(e.run_id, e.tool_call_id, e.status) for e in found] == [
        ('first', 'call-1', 'completed'),
        ('second', 'call-3', 'started'),
    ]
    find = step_persistence.find_tool_effects
    assert await find(store, idempotency_key='charge::42', conversation_id='orders-43') == []
    assert await find(store, idempotency_key='charge::') == [], 'exact keys only'


async def test_resolve_tool_effect_settles_the_record_and_says_so(make_store: StoreMaker) -> None:
    store = await make_store()
    await store.register_run(RunRecord(run_id='crashed', conversation_id='orders', agent_name='payments'))
    await started_call(store, 'crashed', 'call-1', key='charge::42', step=3)
    await started_call(store, 'crashed', 'call-2', step=4)
    resolve = step_persistence.resolve_tool_effect

    settled = await resolve(
        store,
        run_id='crashed',
        tool_call_id='call-1',
        status='completed',
        summary='the charge is in the ledger',
        resolved_by='ops',
    )
    stored = await store.get_tool_effect(run_id='crashed', tool_call_id='call-1')
    assert stored == settled
    assert (stored.status, stored.effect_summary, stored.idempotency_key) == (
        'completed',
        'the charge is in the ledger',
        'charge::42',
    )
    assert stored.ended_at is not None and stored.ended_at >= stored.started_at
    assert [e.tool_call_id for e in await store.list_unresolved_tool_effects(run_id='crashed')] == ['call-2']
    *before, event = await store.list_events(run_id='crashed')
    assert (event.kind, event.step_index, event.tool_call_id, event.tool_name) == (
        'tool_call_completed',
        3,
        'call-1',
        'charge_card',
    )
    assert event.metadata == {'resolved_by': 'ops', 'resolved_at': stored.ended_at.isoformat()}
    assert event.timestamp == max(earlier.timestamp for earlier in before), 'stamped as of the run, not of now'
    assert (event.conversation_id, event.agent_name, event.error) == ('orders', 'payments', None)

    events = len(await store.list_events(run_id='crashed'))
    again = await resolve(
        store, run_id='crashed', tool_call_id='call-1', status='completed', summary='the charge is in the ledger'
    )
    assert again == stored and len(await store.list_events(run_id='crashed')) == events, 'resolving again is a no-op'
    with pytest.raises(ValueError, match='already completed'):
        await resolve(store, run_id='crashed', tool_call_id='call-1', status='failed', summary='no charge')

    await resolve(store, run_id='crashed', tool_call_id='call-2', status='failed', summary='no charge was made')
    failed = (await store.list_events(run_id='crashed'))[-1]
    assert (failed.kind, failed.error, failed.step_index) == ('tool_call_failed', 'no charge was made', 4)
    assert await store.list_unresolved_tool_effects(run_id='crashed') == []

    with pytest.raises(LookupError):
        await resolve(store, run_id='crashed', tool_call_id='nope', status='failed', summary='x')
    with pytest.raises(LookupError):
        await resolve(store, run_id='nope', tool_call_id='call-1', status='failed', summary='x')
    with pytest.raises(ValueError, match='summary'):
        await resolve(store, run_id='crashed', tool_call_id='call-1', status='completed', summary='  ')
    with pytest.raises(ValueError, match="'completed' or 'failed'"):
        await resolve(store, run_id='crashed', tool_call_id='call-1', status='started', summary='x')  # type: ignore[arg-type]


async def test_runs_resolve_and_runs_delete(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "runs.db"}'
    async with from_spec(url) as store:
        await store.register_run(RunRecord(run_id='orchestrator'))
        await store.register_run(RunRecord(run_id='worker', parent_run_id='orchestrator'))
        await store.register_run(RunRecord(run_id='helper', parent_run_id='worker'))
        await started_call(store, 'worker', 'call-1', key='charge::42')

    def resolve(call: str, *options: str, expect: int = 0) -> str:
        return cli('runs', 'resolve', 'work', call, *options, '--store', url, expect=expect).stderr

    unknown = resolve('nope', '--status', 'completed', '--summary', 'x', expect=3)
    assert 'nope' in unknown and 'call-1' in unknown, 'lists the unresolved calls'
    assert '--summary' in resolve('call-1', '--status', 'completed', expect=2)
    resolve('call-1', '--status', 'maybe', '--summary', 'x', expect=2)

    resolution = ('--status', 'completed', '--summary', 'charge [found] in the ledger', '--store', url)
    settled = json.loads(cli('runs', 'resolve', 'work', 'call-1', *resolution, '--json').stdout)
    assert (settled['status'], settled['effect_summary'], settled['idempotency_key']) == (
        'completed',
        'charge [found] in the ledger',
        'charge::42',
    )
    assert settled['ended_at'].endswith('Z')
    assert 'resolved tool call call-1 as completed' in cli('runs', 'resolve', 'work', 'call-1', *resolution).stdout
    assert 'already completed' in resolve('call-1', '--status', 'failed', '--summary', 'no', expect=1)
    assert json.loads(cli('runs', 'unresolved', '--store', url, '--json').stdout) == []
    shown = json.loads(cli('runs', 'show', 'worker', '--store', url, '--json').stdout)
    assert shown['events'][-1]['metadata'] == {
        'resolved_by': 'step-persistence runs resolve',
        'resolved_at': settled['ended_at'].replace('Z', '+00:00'),
    }

    kept = cli('runs', 'delete', 'worker', '--store', url)
    assert 'deleted run worker' in kept.stdout and '1 run(s) delegated from it are kept' in kept.stderr
    assert json.loads(cli('runs', 'delete', 'orchestrator', '--cascade', '--store', url, '--json').stdout) == {
        'deleted': ['orchestrator']
    }
    async with from_spec(url) as store:
        assert [run.run_id for run in await store.list_runs()] == ['helper']
        await store.register_run(RunRecord(run_id='root'))
        await store.register_run(RunRecord(run_id='child', parent_run_id='root'))
        await store.register_run(RunRecord(run_id='grandchild', parent_run_id='child'))
    assert json.loads(cli('runs', 'delete', 'root', '--cascade', '--store', url, '--json').stdout) == {
        'deleted': ['root', 'child', 'grandchild']
    }
    assert 'root' in cli('runs', 'delete', 'root', '--store', url, expect=3).stderr


async def test_a_crashed_run_settled_from_outside_stays_crashed(make_store: StoreMaker) -> None:
    store = await make_store()
    long_ago = utc_now() - timedelta(hours=2)
    await store.register_run(RunRecord(run_id='old', started_at=long_ago))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='old', tool_call_id='c', tool_name='pay', status='started', started_at=long_ago)
    )
    await store.append_event(
        StepEvent(run_id='old', kind='tool_call_started', step_index=1, tool_call_id='c', timestamp=long_ago)
    )
    await step_persistence.resolve_tool_effect(
        store, run_id='old', tool_call_id='c', status='failed', summary='no charge was made'
    )
    events = await store.list_events(run_id='old')
    assert run_status(events, await store.list_unresolved_tool_effects(run_id='old')) == 'crashed'
