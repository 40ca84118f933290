"""Durable replay in one process: what a second run of a workflow replays, runs again or refuses.

A run is stopped mid-way by cancelling it while a tool or a model request is inside (its unit stays
`started`, as a crash leaves it; tests/durable/test_durable_crash.py kills real processes). Every
count is of what really ran: the scripted model's requests and the tools' bodies.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, DeferredToolRequests, FunctionToolset, RunContext, Tool, ToolOutput
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from step_persistence import InMemoryStepStore, RunRecord, StepPersistence, StepStore
from step_persistence.durable import child_workflow_id, journal_for
from step_persistence.durable.engine import StepDurability
from step_persistence.durable.errors import (
    AskWithoutDeferredOutputError,
    CodeVersionMismatchError,
    InFlightUnitError,
    ReplayDivergedError,
)
from support.backends import BACKENDS
from support.durable_agents import DELEGATE_CALL, Calls, build_agent, build_delegating_agent, wait_until
from support.recording import RecordingStore

pytestmark = pytest.mark.anyio


@pytest.fixture(params=['file', 'memory', 'mongo', 'postgres', 'sqlite'])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StepStore]:
    async with BACKENDS[request.param].open(request) as session:
        yield await session.make()


async def _completed(store: StepStore, run_id: str, tool_call_id: str) -> bool:
    units = await journal_for(store).list_units(workflow_id=run_id)
    return any(unit.tool_call_id == tool_call_id and unit.status == 'completed' for unit in units)


async def _stop_inside(store: StepStore, where: str, run_id: str, **options: Any) -> Calls:
    """Run the workflow until `where` (a tool, or `model:<n>`) is running, then stop the run there."""
    calls = Calls()
    entered = asyncio.Event()

    async def hang() -> None:
        if where == 'charge':  # its sibling's unit completes first, so exactly one call is in flight
            await wait_until(lambda: _completed(store, run_id, 'call-reserve'))
        entered.set()
        await asyncio.Event().wait()

    calls.hooks[where] = hang
    run = asyncio.create_task(build_agent(store, calls, **options).run('two items', run_id=run_id))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    return calls


async def test_a_finished_run_replays_every_unit_and_leaves_one_record(store: StepStore) -> None:
    first = Calls()
    result = await build_agent(store, first).run('two items', run_id='order-1')
    assert (first.model, dict(first.tools)) == (2, {'reserve': 1, 'charge': 1})
    events = await store.list_events(run_id='order-1')

    again = Calls()
    replayed = await build_agent(store, again).run('two items', run_id='order-1')
    assert (again.model, dict(again.tools)) == (0, {})
    assert replayed.output == result.output == 'done: reserve=reserved A-1, charge=charged 1250'
    assert [run.run_id for run in await store.list_runs()] == ['order-1']
    assert await store.list_events(run_id='order-1') == events
    assert await store.list_unresolved_tool_effects(run_id='order-1') == []
    workflow = await journal_for(store).get_workflow(workflow_id='order-1')
    assert workflow is not None and (workflow.status, workflow.attempts) == ('completed', 2)
    units = await journal_for(store).list_units(workflow_id='order-1')
    assert sorted(unit.kind for unit in units) == ['model', 'model', 'tool', 'tool'], (
        "StepPersistence's writes are no units"
    )


async def _record_of(store: StepStore, run_id: str) -> tuple[object, ...]:
    return (
        await store.get_run(run_id=run_id),
        await store.list_events(run_id=run_id),
        await store.list_tool_effects(run_id=run_id),
        await store.list_snapshots(run_id=run_id, include_interrupted=True),
    )


async def test_a_full_replay_writes_nothing_to_the_record(store: StepStore) -> None:
    await build_agent(store, Calls()).run('two items', run_id='order-w')
    before = await _record_of(store, 'order-w')

    recording = RecordingStore(store)
    replayed = await build_agent(store, Calls(), record_into=recording).run('two items', run_id='order-w')
    assert replayed.output == 'done: reserve=reserved A-1, charge=charged 1250'
    assert recording.writes == [], 'every write of the replay is stored already'
    assert await _record_of(store, 'order-w') == before


async def test_a_partial_replay_writes_only_what_the_stopped_run_did_not(store: StepStore) -> None:
    await _stop_inside(store, 'charge', 'order-p', idempotent_b=True)
    events = await store.list_events(run_id='order-p')
    snapshots = await store.list_snapshots(run_id='order-p', include_interrupted=True)

    recording = RecordingStore(store)
    await build_agent(store, Calls(), idempotent_b=True, record_into=recording).run('two items', run_id='order-p')
    methods = [method for method, _ in recording.writes]
    assert 'register_run' not in methods
    saved = [record.idempotency_key for method, record in recording.writes if method == 'save_snapshot']
    assert saved and not {snapshot.idempotency_key for snapshot in snapshots} & set(saved)
    # The flush of the step before the stopped call, replayed, is not written (its writes are stored); the
    # flush that starts the call again is (the stopped run left the call failed: cancelled).
    appended = [record.idempotency_key for method, record in recording.writes if method == 'append_event']
    assert 'order-p:run_started' not in appended and 'order-p:model:1:started' not in appended
    after = await store.list_events(run_id='order-p')
    assert after[: len(events)] == events and len({event.idempotency_key for event in after}) == len(after)


async def test_a_run_stopped_in_an_idempotent_tool_reruns_only_that_tool(store: StepStore) -> None:
    stopped = await _stop_inside(store, 'charge', 'order-2', idempotent_b=True)
    assert (stopped.model, dict(stopped.tools)) == (1, {'reserve': 1, 'charge': 1})

    resumed = Calls()
    recording = RecordingStore(store)
    agent = build_agent(store, resumed, idempotent_b=True, record_into=recording)
    result = await agent.run('two items', run_id='order-2')
    assert (resumed.model, dict(resumed.tools)) == (1, {'charge': 1})
    ledger = [
        (record.tool_call_id, record.status) for method, record in recording.writes if method == 'record_tool_effect'
    ]
    assert ('call-reserve', 'started') not in ledger, 'a replayed call never goes back to started'
    assert ledger.count(('call-charge', 'started')) == 1
    assert result.output == 'done: reserve=reserved A-1, charge=charged 1250'
    units = {unit.tool_call_id: unit for unit in await journal_for(store).list_units(workflow_id='order-2')}
    assert (units['call-charge'].status, units['call-charge'].attempts) == ('completed', 2)
    assert units['call-reserve'].attempts == 1
    effects = {effect.tool_call_id: effect.status for effect in await store.list_tool_effects(run_id='order-2')}
    assert effects == {'call-reserve': 'completed', 'call-charge': 'completed'}
    assert [run.run_id for run in await store.list_runs()] == ['order-2']


async def test_a_tool_in_flight_fails_the_resumed_run_by_default(store: StepStore) -> None:
    await _stop_inside(store, 'charge', 'order-3')
    resumed = Calls()
    with pytest.raises(InFlightUnitError, match=r"tool call 'charge' \(call-charge\) was in flight") as raised:
        await build_agent(store, resumed).run('two items', run_id='order-3')
    assert 'continue_run' in str(raised.value)
    assert raised.value.unit_key is not None and 'call-charge' in raised.value.unit_key
    assert resumed.tools['charge'] == 0
    # As for `ask`: the effect is unknown, so the ledger record stays in flight with the interrupted run's key and
    # summary, and `list_unresolved_tool_effects` (`step-persistence runs unresolved`) still shows it.
    effect = await store.get_tool_effect(run_id='order-3', tool_call_id='call-charge')
    assert effect is not None
    assert (effect.status, effect.idempotency_key, effect.effect_summary) == (
        'started',
        'charge-order-3',
        'card charged',
    )
    unresolved = await store.list_unresolved_tool_effects(run_id='order-3')
    assert [each.tool_call_id for each in unresolved] == ['call-charge']


async def test_a_tool_marked_not_idempotent_is_not_run_again_whatever_the_default(store: StepStore) -> None:
    options: dict[str, Any] = {'in_flight_tools': 'rerun', 'charge_config': {'idempotent': False}}
    await _stop_inside(store, 'charge', 'order-3n', **options)
    resumed = Calls()
    with pytest.raises(InFlightUnitError, match=r"tool call 'charge' \(call-charge\) was in flight"):
        await build_agent(store, resumed, **options).run('two items', run_id='order-3n')
    assert resumed.tools['charge'] == 0


async def test_ask_ends_the_run_with_the_call_deferred_and_its_ledger_key(store: StepStore) -> None:
    await _stop_inside(store, 'charge', 'order-4', in_flight_tools='ask')
    resumed = Calls()
    result = await build_agent(store, resumed, in_flight_tools='ask').run('two items', run_id='order-4')
    assert resumed.tools['charge'] == 0 and resumed.model == 0
    assert isinstance(result.output, DeferredToolRequests)
    assert [call.tool_call_id for call in result.output.calls] == ['call-charge']
    details = result.output.metadata['call-charge']['step_persistence']
    assert details['reason'] == 'in_flight'
    assert (details['idempotency_key'], details['effect_summary']) == ('charge-order-4', 'card charged')
    # The refused call's ledger record stays the evidence it was: in flight (unknown), its key and summary kept.
    effect = await store.get_tool_effect(run_id='order-4', tool_call_id='call-charge')
    assert effect is not None
    evidence = (effect.status, effect.idempotency_key, effect.effect_summary)
    assert evidence == ('started', 'charge-order-4', 'card charged')
    kinds = [event.kind for event in await store.list_events(run_id='order-4') if event.tool_call_id == 'call-charge']
    assert kinds[-1] == 'tool_call_failed', 'the refused call still ends in the event log'


async def test_ask_under_an_output_type_without_deferred_requests_says_so_and_stays_resumable(
    store: StepStore,
) -> None:
    await _stop_inside(store, 'charge', 'order-4o', in_flight_tools='ask')
    resumed = Calls()
    agent = build_agent(store, resumed, in_flight_tools='ask')
    message = r"tool call 'charge' \(call-charge\) was in flight .* \"ask\", .* does not include DeferredToolRequests"
    with pytest.raises(AskWithoutDeferredOutputError, match=message) as raised:
        await agent.run('two items', run_id='order-4o', output_type=str)
    assert isinstance(raised.value.__cause__, UserError)  # pydantic-ai's own error, said of the handed-back calls
    assert resumed.tools['charge'] == 0
    effect = await store.get_tool_effect(run_id='order-4o', tool_call_id='call-charge')
    assert effect is not None and (effect.status, effect.effect_summary) == ('started', 'card charged')
    # Nothing was lost: run with an output type that can hold the handed-back call, the workflow asks as documented.
    result = await agent.run('two items', run_id='order-4o')
    assert isinstance(result.output, DeferredToolRequests)
    assert [call.tool_call_id for call in result.output.calls] == ['call-charge']
    assert resumed.tools['charge'] == 0


async def test_a_model_request_in_flight_runs_again(store: StepStore) -> None:
    stopped = await _stop_inside(store, 'model:2', 'order-5', idempotent_b=True)
    assert (stopped.model, dict(stopped.tools)) == (2, {'reserve': 1, 'charge': 1})
    resumed = Calls()
    result = await build_agent(store, resumed).run('two items', run_id='order-5')
    assert (resumed.model, dict(resumed.tools)) == (1, {})
    assert result.output == 'done: reserve=reserved A-1, charge=charged 1250'


async def test_a_failed_unit_runs_again(store: StepStore) -> None:
    failing = Calls()

    def fail() -> None:
        raise RuntimeError('provider down')

    failing.hooks['model:2'] = fail
    with pytest.raises(RuntimeError, match='provider down'):
        await build_agent(store, failing).run('two items', run_id='order-6')
    workflow = await journal_for(store).get_workflow(workflow_id='order-6')
    assert workflow is not None and workflow.status == 'failed'
    resumed = Calls()
    await build_agent(store, resumed).run('two items', run_id='order-6')
    assert (resumed.model, dict(resumed.tools)) == (1, {})


async def test_a_replay_with_other_inputs_is_refused_naming_the_unit(store: StepStore) -> None:
    await _stop_inside(store, 'charge', 'order-7', idempotent_b=True)
    with pytest.raises(ReplayDivergedError, match='the run was started with another prompt') as raised:
        await build_agent(store, Calls(), idempotent_b=True).run('three items', run_id='order-7')
    assert 'continue_run' in str(raised.value)
    changed = Calls()
    with pytest.raises(ReplayDivergedError, match=r'the inputs of the model request of step1') as raised:
        await build_agent(store, changed, instructions='Refuse orders.').run('two items', run_id='order-7')
    assert raised.value.unit_key == 'orders__model.request#step1#0'
    assert (changed.model, dict(changed.tools)) == (0, {})


@pytest.mark.parametrize('argument', ['note', 'timestamp'])
async def test_a_changed_tool_argument_is_refused_whatever_its_name(store: StepStore, argument: str) -> None:
    """Only the timestamps pydantic-ai stamps on messages and parts are left out, not a tool's own `timestamp`."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart('book', {'room': 'A'}, tool_call_id='call-book')])
        return ModelResponse(parts=[TextPart('booked')])

    def agent_booking_at(when: str) -> Agent[None, str]:
        # The code changed between the runs: the same call's validated arguments get another default.
        def book_noting(room: str, note: str = when) -> str:
            return f'booked {room}'

        def book_stamped(room: str, timestamp: str = when) -> str:
            return f'booked {room}'

        tool = Tool(book_noting if argument == 'note' else book_stamped, name='book')
        return Agent(FunctionModel(model), name='booking', tools=[tool], capabilities=[StepDurability(store)])

    await agent_booking_at('09:00').run('Book room A', run_id=f'book-{argument}')
    with pytest.raises(ReplayDivergedError, match=r"the inputs of tool call 'book' \(call-book\)"):
        await agent_booking_at('10:00').run('Book room A', run_id=f'book-{argument}')


async def test_another_code_version_is_refused_unless_allowed(store: StepStore) -> None:
    await _stop_inside(store, 'charge', 'order-8', idempotent_b=True, code_version='v1')
    with pytest.raises(CodeVersionMismatchError, match="started by code version 'v1', and this is 'v2'"):
        await build_agent(store, Calls(), idempotent_b=True, code_version='v2').run('two items', run_id='order-8')
    resumed = Calls()
    options: dict[str, Any] = {'code_version': 'v2', 'allow_code_version_change': True}
    await build_agent(store, resumed, idempotent_b=True, **options).run('two items', run_id='order-8')
    assert (resumed.model, dict(resumed.tools)) == (1, {'charge': 1})


@dataclass
class _RefusingRegistration(RecordingStore):
    """Refuses every run registration, as a store refuses a run id it cannot hold (an SQL store, one too long)."""

    async def register_run(self, record: RunRecord) -> None:
        raise ValueError(f'run_id {record.run_id!r} refused: nothing was written')


async def test_a_refused_run_leaves_a_completed_workflow_completed(store: StepStore) -> None:
    journal = journal_for(store)
    await build_agent(store, Calls(), record=False, code_version='v1').run('two items', run_id='order-9')
    completed = await journal.get_workflow(workflow_id='order-9')
    assert completed is not None and completed.status == 'completed'
    # Refused by what the workflow recorded: before it is started again, so it is left exactly as it was.
    with pytest.raises(ReplayDivergedError, match='another prompt'):
        await build_agent(store, Calls(), record=False, code_version='v1').run('three items', run_id='order-9')
    with pytest.raises(CodeVersionMismatchError):
        await build_agent(store, Calls(), record=False, code_version='v2').run('two items', run_id='order-9')
    assert await journal.get_workflow(workflow_id='order-9') == completed
    # Refused as it replays (a unit's inputs), or by a capability as it starts (`StepPersistence`'s store refusing
    # the run id): the run started (an attempt), ran no unit, and the workflow stays completed.
    changed = build_agent(store, Calls(), record=False, code_version='v1', instructions='Refuse orders.')
    with pytest.raises(ReplayDivergedError, match='the inputs of the model request'):
        await changed.run('two items', run_id='order-9')
    refusing = build_agent(store, Calls(), record_into=_RefusingRegistration(store), code_version='v1')
    with pytest.raises(ValueError, match="run_id 'order-9' refused"):
        await refusing.run('two items', run_id='order-9')
    after = await journal.get_workflow(workflow_id='order-9')
    assert after is not None and (after.status, after.attempts, after.owner) == ('completed', 3, None)


async def test_replay_works_without_step_persistence(store: StepStore) -> None:
    await build_agent(store, Calls(), record=False).run('two items', run_id='order-9')
    again = Calls()
    await build_agent(store, again, record=False).run('two items', run_id='order-9')
    assert (again.model, dict(again.tools)) == (0, {})
    assert await store.list_runs() == []


def test_a_store_without_a_journal_is_refused_up_front() -> None:
    with pytest.raises(TypeError, match='RecordingStore holds no durable journal'):
        StepDurability(RecordingStore(InMemoryStepStore()))


def test_an_older_pydantic_ai_gets_an_import_error_naming_the_version() -> None:
    """The benchmark environment's pydantic-ai (2.62) has no `replay_scope`: simulated by removing the name."""
    script = (
        'import pydantic_ai.durable_exec as d\n'
        "del d._exports['replay_scope']\n"
        'try:\n'
        '    import step_persistence.durable.engine\n'
        'except ImportError as error:\n'
        '    print(error)\n'
        'import step_persistence, step_persistence.durable\n'
        'from step_persistence import StepPersistence, InMemoryStepStore\n'
        'print("the rest imports")\n'
    )
    completed = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60, check=True)
    assert 'needs pydantic-ai-slim >= 2.68' in completed.stdout
    assert 'the rest imports' in completed.stdout


async def test_run_stream_replays_too(store: StepStore) -> None:
    calls: Counter[str] = Counter()

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        calls['model'] += 1
        if len(messages) == 1:
            yield {0: DeltaToolCall(name='lookup', json_args='{"q": "stock"}', tool_call_id='call-lookup')}
        else:
            yield 'in '
            yield 'stock'

    def lookup(q: str) -> str:
        calls['lookup'] += 1
        return f'found {q}'

    for _ in range(2):
        agent = Agent(
            FunctionModel(stream_function=stream),
            name='streamer',
            tools=[lookup],
            capabilities=[StepPersistence(store), StepDurability(store)],
        )
        async with agent.run_stream('Is it in stock?', run_id='stream-1') as result:
            assert await result.get_output() == 'in stock'
        assert calls == {'model': 2, 'lookup': 1}, 'the second run replays the streamed requests and the call'
    assert [run.run_id for run in await store.list_runs()] == ['stream-1']


async def test_the_capabilitys_event_stream_handler_gets_the_first_runs_deltas_live(store: StepStore) -> None:
    log: list[tuple[str, str]] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        log.append(('model', f'request {len(messages)}'))
        if len(messages) == 1:
            yield {0: DeltaToolCall(name='lookup', json_args='{"q": "stock"}', tool_call_id='call-lookup')}
            return
        for word in ['in ', 'stock']:
            log.append(('model', word))
            yield word

    def lookup(q: str) -> str:
        return f'found {q}'

    async def handler(ctx: RunContext[None], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                log.append(('handler', event.delta.content_delta))
            else:
                log.append(('handler', type(event).__name__))

    agent = Agent(
        FunctionModel(stream_function=stream),
        name='streamer',
        tools=[lookup],
        capabilities=[StepDurability(store, event_stream_handler=handler)],
    )
    assert (await agent.run('Is it in stock?', run_id='stream-live')).output == 'in stock'
    # Each delta reached the handler before the model produced the next one.
    assert log[log.index(('model', 'request 3')) :] == [
        ('model', 'request 3'),
        ('model', 'in '),
        ('handler', 'PartStartEvent'),
        ('handler', 'FinalResultEvent'),
        ('model', 'stock'),
        ('handler', 'stock'),
        ('handler', 'PartEndEvent'),
    ]
    log.clear()
    assert (await agent.run('Is it in stock?', run_id='stream-live')).output == 'in stock'
    assert log == [('handler', 'FunctionToolCallEvent'), ('handler', 'FunctionToolResultEvent')], (
        "a replay delivers the run's tool events again and no model event"
    )


async def test_an_output_function_is_workflow_code_run_again_by_every_replay(store: StepStore) -> None:
    """As docs/durable.md, "Workflow code", says: the output tool's call replays, and the function runs again."""
    calls: Counter[str] = Counter()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls['model'] += 1
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {'order': 42}, tool_call_id='call-out')])

    def place_order(order: int) -> str:
        """Place the order."""
        calls['place_order'] += 1
        return f'placed {order}'

    for output_type in (place_order, ToolOutput(place_order)):
        calls.clear()
        run_id = f'order-{type(output_type).__name__}'
        agent = Agent(
            FunctionModel(model), name='orders', output_type=output_type, capabilities=[StepDurability(store)]
        )
        assert (await agent.run('Order 42', run_id=run_id)).output == 'placed 42'
        assert (await agent.run('Order 42', run_id=run_id)).output == 'placed 42'  # a completed workflow's replay
        assert calls == {'model': 1, 'place_order': 2}


class _Order(BaseModel):
    cents: int


@dataclass
class _Line:
    sku: str


class _Status(Enum):
    PAID = 'paid'


async def test_a_tools_result_comes_back_as_its_json_form_on_the_first_run_and_every_replay(store: StepStore) -> None:
    """The table of docs/durable.md, "What a tool's result comes back as"."""
    returned = {
        'when': datetime(2026, 12, 3, tzinfo=UTC),
        'day': date(2026, 12, 3),
        'id': UUID(int=1),
        'amount': Decimal('1.5'),
        'status': _Status.PAID,
        'pair': (1, 2),
        'by_number': {1: 'one'},
        'order': _Order(cents=5),
        'line': _Line(sku='A'),
        'text_bytes': b'hi',
    }

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart('fetch', {}, tool_call_id='call-fetch')])
        return ModelResponse(parts=[TextPart('done')])

    def fetch() -> dict[str, object]:
        return returned

    agent = Agent(FunctionModel(model), name='fetcher', tools=[fetch], capabilities=[StepDurability(store)])
    for _ in range(2):
        messages = (await agent.run('Fetch', run_id='fetch-1')).all_messages()
        [part] = messages[2].parts
        assert isinstance(part, ToolReturnPart)
        assert part.content == {
            'when': '2026-12-03T00:00:00Z',
            'day': '2026-12-03',
            'id': '00000000-0000-0000-0000-000000000001',
            'amount': '1.5',
            'status': 'paid',
            'pair': [1, 2],
            'by_number': {'1': 'one'},
            'order': {'cents': 5},
            'line': {'sku': 'A'},
            'text_bytes': 'hi',
        }


@dataclass
class Audit(AbstractCapability[None]):
    """A capability with a durable operation of its own, called before each model request."""

    calls: Counter[str] = field(default_factory=Counter[str])

    @durable_operation(name='audit')
    async def audit(self, ctx: RunContext[None], note: str) -> str:
        self.calls['audit'] += 1
        return f'audited {note}'

    async def before_model_request(self, ctx: RunContext[None], request_context: Any) -> Any:
        await self.audit(ctx, f'step {ctx.run_step}')
        return request_context


def _lookup_model(calls: Counter[str]) -> FunctionModel:
    """A model that calls `lookup` once, then answers `in stock` (its requests counted as `model`)."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls['model'] += 1
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart('lookup', {'q': 'stock'}, tool_call_id='call-lookup')])
        return ModelResponse(parts=[TextPart('in stock')])

    return FunctionModel(model)


async def test_dynamic_toolsets_and_capability_operations_replay(store: StepStore) -> None:
    calls: Counter[str] = Counter()

    model = _lookup_model(calls)

    def tools(ctx: RunContext[None]) -> FunctionToolset[None]:
        toolset = FunctionToolset[None]()

        @toolset.tool_plain
        def lookup(q: str) -> str:
            calls['lookup'] += 1
            return f'found {q}'

        return toolset

    audits: Counter[str] = Counter()
    for _ in range(2):
        agent = Agent(
            model,
            name='dynamic',
            toolsets=[DynamicToolset(tools, id='catalog')],
            capabilities=[Audit(id='audit', calls=audits), StepDurability(store)],
        )
        assert (await agent.run('Is it in stock?', run_id='dynamic-1')).output == 'in stock'
        assert (calls['model'], calls['lookup'], audits['audit']) == (2, 1, 2), 'the second run replays them'
    kinds = Counter(unit.kind for unit in await journal_for(store).list_units(workflow_id='dynamic-1'))
    assert kinds == {'discovery': 2, 'capability': 2, 'model': 2, 'tool': 1}


async def _stop_inside_the_delegate(store: StepStore, run_id: str, **options: Any) -> tuple[Calls, Calls]:
    """Run the desk workflow until its delegate's `charge` runs (after `reserve` completed), then stop it there."""
    child_id = child_workflow_id(run_id, DELEGATE_CALL)
    desk, orders = Calls(), Calls()
    entered = asyncio.Event()

    async def hang() -> None:
        await wait_until(lambda: _completed(store, child_id, 'call-reserve'))
        entered.set()
        await asyncio.Event().wait()

    orders.hooks['charge'] = hang
    run = asyncio.create_task(build_delegating_agent(store, desk, orders, **options).run('go', run_id=run_id))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    return desk, orders


async def test_a_delegate_is_a_child_workflow_that_replays_its_own_units(store: StepStore) -> None:
    """Stopped inside the delegate's second tool: the resumed parent runs its tool again (the delegate's journal
    decides for the delegate's units), and the delegate replays its first request and its completed call."""
    child_id = child_workflow_id('desk-1', DELEGATE_CALL)
    desk, orders = await _stop_inside_the_delegate(store, 'desk-1', idempotent_b=True)
    assert (desk.model, dict(desk.tools), orders.model, dict(orders.tools)) == (
        1,
        {'delegate': 1},
        1,
        {'reserve': 1, 'charge': 1},
    )

    resumed_desk, resumed_orders = Calls(), Calls()
    result = await build_delegating_agent(store, resumed_desk, resumed_orders, idempotent_b=True).run(
        'go', run_id='desk-1'
    )
    assert result.output == 'desk: delegate=done: reserve=reserved A-1, charge=charged 1250'
    assert (resumed_desk.model, dict(resumed_desk.tools)) == (1, {'delegate': 1}), 'the first request replayed'
    assert (resumed_orders.model, dict(resumed_orders.tools)) == (1, {'charge': 1}), "the delegate's replayed"
    journal = journal_for(store)
    child = await journal.get_workflow(workflow_id=child_id)
    assert child is not None and (child.status, child.attempts) == ('completed', 2)
    parent_unit = {unit.tool_call_id: unit for unit in await journal.list_units(workflow_id='desk-1')}[DELEGATE_CALL]
    assert child.inputs['parent'] == {
        'workflow_id': 'desk-1',
        'unit_key': parent_unit.unit_key,
        'tool_call_id': DELEGATE_CALL,
    }
    assert (parent_unit.status, parent_unit.attempts) == ('completed', 2)
    runs = {run.run_id: run.parent_run_id for run in await store.list_runs()}
    assert runs == {'desk-1': None, child_id: 'desk-1'}, 'one record each, the delegate linked to its parent'

    again_desk, again_orders = Calls(), Calls()
    await build_delegating_agent(store, again_desk, again_orders, idempotent_b=True).run('go', run_id='desk-1')
    assert (again_desk.model, dict(again_desk.tools), again_orders.model, dict(again_orders.tools)) == (0, {}, 0, {})


class RemoteToolset(AbstractToolset[None]):
    """A toolset of its own kind, as an MCP client is: a session entered around its use, tools listed by the
    server, calls sent to it (counted in `calls`: `enter`, `list`, `call`). `hang` stops inside the next call."""

    def __init__(self, calls: Counter[str], *, hang: asyncio.Event | None = None) -> None:
        self.calls = calls
        self.hang = hang

    @property
    def id(self) -> str:
        return 'remote-catalog'

    async def __aenter__(self) -> RemoteToolset:
        self.calls['enter'] += 1
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.calls['exit'] += 1

    async def get_tools(self, ctx: RunContext[None]) -> dict[str, ToolsetTool[None]]:
        self.calls['list'] += 1
        tool_def = ToolDefinition(
            name='lookup',
            parameters_json_schema={'type': 'object', 'properties': {'q': {'type': 'string'}}},
            metadata={'step_persistence': {'idempotent': True}},
        )
        validator = SchemaValidator(core_schema.dict_schema())
        return {'lookup': ToolsetTool(toolset=self, tool_def=tool_def, max_retries=1, args_validator=validator)}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[None], tool: Any) -> str:
        self.calls['call'] += 1
        if self.hang is not None:
            self.hang.set()
            await asyncio.Event().wait()
        return f'found {tool_args["q"]}'


async def test_a_toolset_of_another_kind_is_journaled_and_replayed(store: StepStore) -> None:
    """pydantic-ai wraps function, dynamic and MCP toolsets; any other leaf is journaled as a dynamic toolset."""
    calls: Counter[str] = Counter()

    model = _lookup_model(calls)

    def agent(toolset: RemoteToolset) -> Agent[None, str]:
        return Agent(model, name='remote', toolsets=[toolset], capabilities=[StepDurability(store)])

    inside = asyncio.Event()
    run = asyncio.create_task(agent(RemoteToolset(calls, hang=inside)).run('Is it in stock?', run_id='remote-1'))
    await inside.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert (calls['model'], calls['call']) == (1, 1)

    before = calls.copy()
    result = await agent(RemoteToolset(calls)).run('Is it in stock?', run_id='remote-1')
    assert result.output == 'in stock'
    resumed = calls - before
    assert (resumed['model'], resumed['call']) == (1, 1), 'the first request replayed; the call in flight ran again'
    assert calls['enter'] == calls['exit'], 'every session entered was left'

    before = calls.copy()
    await agent(RemoteToolset(calls)).run('Is it in stock?', run_id='remote-1')
    assert calls - before == Counter(), 'a whole replay lists, enters and calls nothing'
    kinds = Counter(unit.kind for unit in await journal_for(store).list_units(workflow_id='remote-1'))
    assert kinds == {'discovery': 2, 'model': 2, 'tool': 1}


async def test_a_delegating_tool_keeps_its_own_in_flight_policy(store: StepStore) -> None:
    """Only the default policy gives way to the child's journal: a tool that sets `fail` itself fails the resume."""
    await _stop_inside_the_delegate(store, 'desk-2', idempotent_b=True, delegate_in_flight='fail')
    desk, orders = Calls(), Calls()
    agent = build_delegating_agent(store, desk, orders, idempotent_b=True, delegate_in_flight='fail')
    with pytest.raises(InFlightUnitError, match=r"tool call 'delegate' \(call-delegate\) was in flight"):
        await agent.run('go', run_id='desk-2')
    assert (desk.tools['delegate'], orders.model, dict(orders.tools)) == (0, 0, {})
