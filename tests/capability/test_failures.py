"""StepPersistence when tools raise, retry, get cancelled, or fail beside siblings."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelRequest, ToolReturnPart

from step_persistence import StepPersistence, StepStore, inspect_recovery
from support.backends import StoreMaker
from support.recording import RecordingStore
from support.scripted import calls, scripted, text

pytestmark = pytest.mark.anyio


def returned_call_ids(messages: list[Any]) -> set[str]:
    return {
        part.tool_call_id
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.outcome == 'success'
    }


async def test_a_tool_that_raises_fails_the_run_with_an_interrupted_snapshot(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = Agent(
        scripted(calls(('fine', {}, 'ok-1')), calls(('explode', {}, 'boom-1')), text('unreachable')),
        capabilities=[StepPersistence(store=store, agent_name='worker')],
    )

    @agent.tool_plain
    async def fine() -> str:
        return 'fine'

    @agent.tool_plain
    async def explode() -> str:
        raise RuntimeError('disk on fire')

    with pytest.raises(RuntimeError, match='disk on fire'):
        await agent.run('go')

    [run] = await store.list_runs()
    kinds = [event.kind for event in await store.list_events(run_id=run.run_id)]
    assert kinds[-3:] == ['tool_call_started', 'tool_call_failed', 'run_failed']
    failure_events = [
        e for e in await store.list_events(run_id=run.run_id) if e.kind in ('tool_call_failed', 'run_failed')
    ]
    assert all('disk on fire' in (e.error or '') for e in failure_events)
    assert all(e.step_index == 2 for e in failure_events)

    effect = await store.get_tool_effect(run_id=run.run_id, tool_call_id='boom-1')
    assert effect is not None and effect.status == 'failed'
    assert effect.effect_summary is not None and 'disk on fire' in effect.effect_summary
    assert await store.list_unresolved_tool_effects(run_id=run.run_id) == []

    interrupted = await store.latest_snapshot(run_id=run.run_id, include_interrupted=True)
    complete = await store.latest_snapshot(run_id=run.run_id)
    assert interrupted is not None and interrupted.state == 'interrupted'
    assert complete is not None and complete.step_index == 1 and len(complete.messages) == 3
    report = await inspect_recovery(store=store, run_id=run.run_id)
    assert report.failed_tools == ['explode'] and report.completed_tools == ['fine']
    assert report.latest_complete_snapshot == complete


async def test_model_retry_closes_the_ledger_record_as_retried(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = Agent(
        scripted(calls(('flaky', {}, 'try-1')), calls(('flaky', {}, 'try-2')), text('done')),
        capabilities=[StepPersistence(store=store)],
    )
    attempts: list[int] = []

    @agent.tool_plain(retries=2)
    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ModelRetry('not yet')
        return 'ok'

    await agent.run('go')
    [run] = await store.list_runs()
    first = await store.get_tool_effect(run_id=run.run_id, tool_call_id='try-1')
    second = await store.get_tool_effect(run_id=run.run_id, tool_call_id='try-2')
    assert first is not None and first.status == 'failed'
    assert first.effect_summary is not None and 'retried' in first.effect_summary and 'not yet' in first.effect_summary
    assert second is not None and second.status == 'completed'
    assert await store.list_unresolved_tool_effects(run_id=run.run_id) == []
    latest = await store.latest_snapshot(run_id=run.run_id)
    assert latest is not None and latest.state == 'complete'


async def test_a_retry_that_exhausts_the_budget_leaves_nothing_started(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = Agent(
        scripted(calls(('never', {}, 'n-1')), calls(('never', {}, 'n-2'))), capabilities=[StepPersistence(store=store)]
    )

    @agent.tool_plain(retries=1)
    async def never() -> str:
        raise ModelRetry('still no')

    with pytest.raises(Exception, match='never'):
        await agent.run('go')
    [run] = await store.list_runs()
    assert await store.list_unresolved_tool_effects(run_id=run.run_id) == []
    events = await store.list_events(run_id=run.run_id)
    assert events[-1].kind == 'run_failed'


class BatchStore(RecordingStore):
    """A pass-through store that can yield to the event loop inside writes (widening the windows in
    which a sibling's failure can cancel a call that is still recording its outcome) and signals
    when a call's `tool_call_completed` event has been written."""

    def __init__(self, inner: StepStore, *, yielding: bool) -> None:
        super().__init__(inner)
        self.yielding = yielding
        self.completed: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def record_tool_effect(self, record: Any) -> None:
        if self.yielding:
            await asyncio.sleep(0)
        await super().record_tool_effect(record)

    async def append_event(self, event: Any) -> None:
        if self.yielding:
            await asyncio.sleep(0)
        await super().append_event(event)
        if event.kind == 'tool_call_completed':
            self.completed[event.tool_call_id].set()


async def _pass(turns: int) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Choreography:
    """How the calls of one batch interleave with the failing one."""

    quick_blocks: bool
    steady_blocks: bool
    boom_waits_for_quick: bool
    yields: dict[str, int]


def batch_agent(store: BatchStore, name: str, plan: Choreography) -> Agent[None, str]:
    """Four parallel calls: `quick` and `steady` return or hang, `boom` raises, `slow` hangs."""
    agent = Agent(
        scripted(
            calls(('quick', {}, 'q'), ('steady', {}, 's'), ('boom', {}, 'b'), ('slow', {}, 'w')),
            text('unreachable'),
        ),
        capabilities=[StepPersistence(store=store, agent_name=name)],
    )
    never = asyncio.Event()

    @agent.tool_plain
    async def quick() -> str:
        await (never.wait() if plan.quick_blocks else _pass(plan.yields['quick']))
        return 'quick'

    @agent.tool_plain
    async def steady() -> str:
        await (never.wait() if plan.steady_blocks else _pass(plan.yields['steady']))
        return 'steady'

    @agent.tool_plain
    async def boom() -> str:
        if plan.boom_waits_for_quick:
            await store.completed['q'].wait()
        await _pass(plan.yields['boom'])
        raise RuntimeError('sibling failed')

    @agent.tool_plain
    async def slow() -> str:
        await never.wait()
        return 'never'

    return agent


async def test_parallel_batch_with_a_failing_sibling_stays_consistent(make_store: StoreMaker) -> None:
    rng = random.Random(20261130)
    outcomes: set[tuple[str, ...]] = set()
    inner = await make_store()
    for iteration in range(50):
        store = BatchStore(inner, yielding=bool(iteration % 2))
        kind = iteration % 3
        plan = Choreography(
            quick_blocks=kind == 0,
            steady_blocks=kind != 2,
            boom_waits_for_quick=kind == 1,
            yields={name: rng.randrange(0, 12) for name in ('quick', 'steady', 'boom')},
        )
        agent = batch_agent(store, f'batch{iteration}', plan)
        with pytest.raises(RuntimeError, match='sibling failed'):
            await agent.run('go')

        [run] = await inner.list_runs(agent_name=f'batch{iteration}')
        snapshot = await store.latest_snapshot(run_id=run.run_id, include_interrupted=True)
        assert snapshot is not None and snapshot.state == 'interrupted'
        in_snapshot = returned_call_ids(snapshot.messages)
        events = await store.list_events(run_id=run.run_id)
        completed_events = {e.tool_call_id for e in events if e.kind == 'tool_call_completed'}
        failed_events = {e.tool_call_id for e in events if e.kind == 'tool_call_failed'}
        ledger = {call_id: await store.get_tool_effect(run_id=run.run_id, tool_call_id=call_id) for call_id in 'qsbw'}
        assert all(record is not None for record in ledger.values())
        completed = {call_id for call_id, record in ledger.items() if record and record.status == 'completed'}
        failed = {call_id for call_id, record in ledger.items() if record and record.status == 'failed'}
        assert completed | failed == set('qsbw'), 'a finished run leaves no started record'
        assert completed == in_snapshot, (iteration, completed, in_snapshot)
        assert completed <= completed_events
        assert failed <= failed_events
        assert {'b', 'w'} <= failed
        assert await store.list_unresolved_tool_effects(run_id=run.run_id) == []
        outcomes.add(tuple(sorted(completed)))
    # Calls cancelled by the failure, finished before it, and racing it all occurred.
    assert {(), ('q',)} <= outcomes, outcomes


async def test_cancelled_run_records_failure_and_closes_the_ledger(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = Agent(scripted(calls(('hang', {}, 'h-1')), text('never')), capabilities=[StepPersistence(store=store)])
    entered = asyncio.Event()

    @agent.tool_plain
    async def hang() -> str:
        entered.set()
        await asyncio.Event().wait()
        return 'unreachable'

    task = asyncio.create_task(agent.run('go'))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [run] = await store.list_runs()
    effect = await store.get_tool_effect(run_id=run.run_id, tool_call_id='h-1')
    assert effect is not None and effect.status == 'failed'
    assert effect.effect_summary is not None and 'cancelled' in effect.effect_summary
    kinds = [event.kind for event in await store.list_events(run_id=run.run_id)]
    assert kinds[-1] == 'run_failed'
    snapshot = await store.latest_snapshot(run_id=run.run_id, include_interrupted=True)
    assert snapshot is not None and snapshot.state == 'interrupted'
