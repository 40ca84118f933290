"""`recover_abandoned` resumes runs that need more than a text prompt: an initial history, the deferred tool
results a run was continued with, and `deps`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext, Tool, ToolApproved
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_persistence import InMemoryStepStore, StepPersistence, StepStore
from step_persistence.durable import DurableUnit, WorkflowRecord, journal_for, recover_abandoned
from step_persistence.durable.engine import StepDurability
from step_persistence.durable.errors import ReplayDivergedError
from step_persistence.durable.inputs import DEFERRED_UNIT, HISTORY_UNIT, PROMPT_UNIT
from support.backends import BACKENDS
from support.durable_agents import Counted, Shop, abandon_inside_charge, build_shop_agent

pytestmark = pytest.mark.anyio

IMAGE = BinaryContent(b'\x89PNG\r\n' + bytes(range(256)) * 64, media_type='image/png')


@pytest.fixture(params=['mongo', 'sqlite'])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StepStore]:
    async with BACKENDS[request.param].open(request) as session:
        yield await session.make()


async def test_a_run_given_a_history_no_store_has_is_recovered_with_it_and_its_deps(store: StepStore) -> None:
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['Here is the receipt', IMAGE])]),
        ModelResponse(parts=[TextPart('noted')]),
    ]
    first = Counted()
    run = build_shop_agent(store, first).run(
        'Charge order 7', message_history=history, deps=Shop('north'), run_id='order-7'
    )
    await abandon_inside_charge(store, run, first, 'order-7')
    journal = journal_for(store)
    workflow = await journal.get_workflow(workflow_id='order-7')
    assert workflow is not None and workflow.inputs['history'] == {'unit': HISTORY_UNIT}
    [journaled] = [unit for unit in await journal.list_units(workflow_id='order-7') if unit.unit_key == HISTORY_UNIT]
    assert journaled.externalized  # the image is in the media store, as a snapshot's would be

    made_for: list[str] = []

    def deps(workflow: WorkflowRecord) -> Shop:
        made_for.append(workflow.workflow_id)
        return Shop('north')

    again = Counted()
    [recovery] = await recover_abandoned(store, agents=[build_shop_agent(store, again)], deps=deps)
    assert (recovery.outcome, recovery.output) == ('resumed', 'north charged 1250 after 2 earlier messages')
    assert made_for == ['order-7']
    assert (again.model, again.charges) == (1, 1)  # the first request replayed; the charge in flight ran again
    [request] = again.seen
    [prompt] = request[0].parts
    assert isinstance(prompt, UserPromptPart) and not isinstance(prompt.content, str)
    text, image = prompt.content
    assert text == 'Here is the receipt'  # and the image came back from the media store:
    assert isinstance(image, BinaryContent) and (image.data, image.media_type) == (IMAGE.data, IMAGE.media_type)
    done = await journal.get_workflow(workflow_id='order-7')
    assert done is not None and done.status == 'completed'


async def test_a_run_continuing_a_stored_snapshot_records_it_by_reference(store: StepStore) -> None:
    earlier = await build_shop_agent(store, Counted()).run('Charge order 8', deps=Shop('south'), run_id='order-8')
    first = Counted()
    history = earlier.all_messages()
    run = build_shop_agent(store, first).run(
        'Charge it again', message_history=history, deps=Shop('south'), run_id='order-9'
    )
    await abandon_inside_charge(store, run, first, 'order-9')
    journal = journal_for(store)
    workflow = await journal.get_workflow(workflow_id='order-9')
    assert workflow is not None
    reference = workflow.inputs['history']['snapshot']
    assert (reference['kind'], reference['run_id']) == ('continued', 'order-8')
    assert HISTORY_UNIT not in {unit.unit_key for unit in await journal.list_units(workflow_id='order-9')}

    again = Counted()
    [recovery] = await recover_abandoned(
        store, agents=[build_shop_agent(store, again)], deps=lambda workflow: Shop('south')
    )
    assert (recovery.outcome, recovery.output) == (
        'resumed',
        f'south charged 1250 after {len(history)} earlier messages',
    )
    assert (again.model, again.charges) == (1, 1)
    resumed = await store.get_run(run_id='order-9')
    assert resumed is not None and resumed.origin is not None
    assert (resumed.origin.kind, resumed.origin.run_id) == ('continued', 'order-8')


async def test_a_workflow_whose_deps_cannot_be_made_is_skipped_unclaimed() -> None:
    store = InMemoryStepStore()
    first = Counted()
    await abandon_inside_charge(
        store,
        build_shop_agent(store, first).run('Charge order 10', deps=Shop('east'), run_id='order-10'),
        first,
        'order-10',
    )

    def deps(workflow: WorkflowRecord) -> Shop:
        raise KeyError(workflow.workflow_id)

    [recovery] = await recover_abandoned(store, agents=[build_shop_agent(store, Counted())], deps=deps)
    assert recovery.outcome == 'skipped' and "its deps could not be made: KeyError: 'order-10'" in (
        recovery.detail or ''
    )
    stored = await journal_for(store).get_workflow(workflow_id='order-10')
    assert stored is not None and stored.owner == 'gone'  # not claimed

    async def async_deps(workflow: WorkflowRecord) -> Shop:
        return Shop('east')

    [recovery] = await recover_abandoned(store, agents=[build_shop_agent(store, Counted())], deps=async_deps)
    assert (recovery.outcome, recovery.output) == ('resumed', 'east charged 1250 after 0 earlier messages')


async def test_a_run_given_a_prompt_of_content_parts_is_recovered_with_it(store: StepStore) -> None:
    first = Counted()
    prompt: list[UserContent] = ['Charge the order on this receipt', IMAGE]
    await abandon_inside_charge(
        store, build_shop_agent(store, first).run(prompt, deps=Shop('west'), run_id='order-11'), first, 'order-11'
    )
    journal = journal_for(store)
    workflow = await journal.get_workflow(workflow_id='order-11')
    assert workflow is not None and (workflow.inputs['prompt'], workflow.inputs['history']) == (
        {'unit': PROMPT_UNIT},
        None,
    )

    again = Counted()
    [recovery] = await recover_abandoned(store, agents=[build_shop_agent(store, again)], deps=lambda _: Shop('west'))
    assert (recovery.outcome, recovery.output) == ('resumed', 'west charged 1250 after 0 earlier messages')
    assert (again.model, again.charges) == (1, 1)
    [prompt_part] = again.seen[0][0].parts
    assert isinstance(prompt_part, UserPromptPart) and not isinstance(prompt_part.content, str)
    text, image = prompt_part.content
    assert text == 'Charge the order on this receipt'
    assert isinstance(image, BinaryContent) and image.data == IMAGE.data


def _approval_agent(store: StepStore, counted: Counted) -> Agent[None, str | DeferredToolRequests]:
    """An agent whose first request calls `delete` (it needs approval), and whose next one answers its result."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        counted.model += 1
        returned = [
            part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if returned:
            return ModelResponse(parts=[TextPart(f'result: {returned[-1]}')])
        return ModelResponse(parts=[ToolCallPart('delete', {'path': '/tmp/x'}, tool_call_id='call-delete')])

    async def delete(ctx: RunContext[None], path: str) -> str:
        counted.charges += 1
        counted.inside.set()
        if counted.release is not None:
            await counted.release.wait()
        ticket = (ctx.tool_call_metadata or {}).get('ticket')
        return f'deleted {path}' + ('' if ticket is None else f' ({ticket})')

    tool = Tool(delete, requires_approval=True, metadata={'step_persistence': {'idempotent': True}})
    return Agent(
        FunctionModel(model),
        name='ops',
        tools=[tool],
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store), StepDurability(store)],
    )


async def test_a_run_continued_with_deferred_tool_results_is_recovered_with_them(store: StepStore) -> None:
    asking = await _approval_agent(store, Counted()).run('remove /tmp/x', run_id='ask-1')
    assert isinstance(asking.output, DeferredToolRequests)
    first = Counted()
    approved = DeferredToolResults(
        approvals={'call-delete': ToolApproved(override_args={'path': '/tmp/y'})},
        metadata={'call-delete': {'ticket': 'T-1'}},
    )
    run = _approval_agent(store, first).run(
        message_history=asking.all_messages(), deferred_tool_results=approved, run_id='approved-1'
    )
    await abandon_inside_charge(store, run, first, 'approved-1')
    assert first.charges == 1
    workflow = await journal_for(store).get_workflow(workflow_id='approved-1')
    assert workflow is not None and workflow.inputs['deferred_tool_results'] == {'unit': DEFERRED_UNIT}

    again = Counted()
    [recovery] = await recover_abandoned(store, agents=[_approval_agent(store, again)])
    # The approval (with its arguments) and the call's metadata are part of what the run was started with: the
    # resumed run runs the approved call (it is idempotent) and answers, rather than asking for the approval again.
    assert (recovery.outcome, recovery.output) == ('resumed', 'result: deleted /tmp/y (T-1)')
    assert again.charges == 1


async def test_a_replay_given_other_deferred_tool_results_or_none_is_refused(store: StepStore) -> None:
    asking = await _approval_agent(store, Counted()).run('remove /tmp/x', run_id='ask-2')
    history = asking.all_messages()
    counted = Counted()
    approved = DeferredToolResults(approvals={'call-delete': True})
    agent = _approval_agent(store, counted)
    result = await agent.run(message_history=history, deferred_tool_results=approved, run_id='approved-2')
    assert result.output == 'result: deleted /tmp/x'
    replayed = await agent.run(message_history=history, deferred_tool_results=approved, run_id='approved-2')
    assert (replayed.output, counted.charges, counted.model) == ('result: deleted /tmp/x', 1, 1)

    refusals = [
        (None, 'given no deferred_tool_results, and was journaled with some'),
        (DeferredToolResults(approvals={'call-delete': False}), 'given other deferred_tool_results'),
    ]
    for other, what in refusals:
        with pytest.raises(ReplayDivergedError, match=what) as refused:
            await agent.run(message_history=history, deferred_tool_results=other, run_id='approved-2')
        assert refused.value.unit_key == DEFERRED_UNIT
    assert (counted.charges, counted.model) == (1, 1)

    # A workflow started without results (its history ended in tool calls) refuses a replay given some.
    asked_again = await agent.run(message_history=history, run_id='asked-again')
    assert isinstance(asked_again.output, DeferredToolRequests)
    with pytest.raises(ReplayDivergedError, match='given deferred_tool_results, and was journaled without'):
        await agent.run(message_history=history, deferred_tool_results=approved, run_id='asked-again')
    assert counted.charges == 1


async def test_a_workflow_whose_journaled_inputs_are_damaged_is_skipped() -> None:
    """Stored data is hostile: a history unit that holds no messages skips its workflow (the next is recovered)."""
    store = InMemoryStepStore()
    journal = journal_for(store)
    inputs = {'prompt': 'Charge order 12', 'history': {'unit': HISTORY_UNIT}, 'fingerprint': 'abc'}
    await journal.start_workflow(WorkflowRecord(workflow_id='order-12', agent_name='orders', inputs=inputs))
    damaged = DurableUnit(
        workflow_id='order-12', unit_key=HISTORY_UNIT, name='x', kind='other', status='completed', result=[{'no': 1}]
    )
    await journal.record_unit(damaged)
    bad_reference = {**inputs, 'history': {'snapshot': {'run_id': 7, 'seq': 'x', 'kind': 'stolen'}}}
    await journal.start_workflow(WorkflowRecord(workflow_id='order-13', agent_name='orders', inputs=bad_reference))
    deferred = {'prompt': None, 'history': None, 'deferred_tool_results': {'unit': DEFERRED_UNIT}, 'fingerprint': 'a'}
    await journal.start_workflow(WorkflowRecord(workflow_id='order-14', agent_name='orders', inputs=deferred))
    await journal.start_workflow(WorkflowRecord(workflow_id='order-15', agent_name='orders', inputs=deferred))
    damaged = DurableUnit(
        workflow_id='order-15', unit_key=DEFERRED_UNIT, name='x', kind='other', status='completed', result=['no']
    )
    await journal.record_unit(damaged)
    recoveries = await recover_abandoned(store, agents=[build_shop_agent(store, Counted())])
    assert [(each.workflow_id, each.outcome) for each in recoveries] == [
        ('order-12', 'skipped'),
        ('order-13', 'skipped'),
        ('order-14', 'skipped'),
        ('order-15', 'skipped'),
    ]
    assert 'its initial message history cannot be read back' in (recoveries[0].detail or '')
    assert 'its recorded history reference is damaged' in (recoveries[1].detail or '')
    assert 'its deferred tool results were not journaled (its run stopped first)' in (recoveries[2].detail or '')
    assert 'its deferred tool results cannot be read back' in (recoveries[3].detail or '')
