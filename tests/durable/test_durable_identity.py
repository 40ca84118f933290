"""Whose a workflow is: the id its record is stored under, the registration it keeps across replays, and the
agent that may run it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic_ai import Agent, DeferredToolRequests, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_persistence import StepPersistence, StepStore, continue_run
from step_persistence.durable import journal_for
from step_persistence.durable.engine import StepDurability
from step_persistence.durable.errors import ReplayDivergedError
from support.backends import BACKENDS

pytestmark = pytest.mark.anyio


@pytest.fixture(params=['file', 'memory', 'sqlite'])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StepStore]:
    async with BACKENDS[request.param].open(request) as session:
        yield await session.make()


def _charging_agent(
    store: StepStore, charges: list[int], *, name: str = 'orders', **persistence: str
) -> Agent[None, str]:
    """The README's form: `StepPersistence(store, agent_name=...)` next to `StepDurability`; `charge` fails once."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart('charge', {'cents': 1250}, tool_call_id='call-1')])
        return ModelResponse(parts=[TextPart('paid')])

    def charge(cents: int) -> str:
        charges.append(cents)
        if len(charges) == 1:
            raise ConnectionError('the payment provider is unreachable')
        return f'charged {cents}'

    return Agent(
        FunctionModel(model),
        name=name,
        tools=[charge],
        capabilities=[StepPersistence(store, **persistence), StepDurability(store)],
    )


async def test_a_durable_run_is_recorded_under_its_workflow_id_whatever_its_agent_name(store: StepStore) -> None:
    charges: list[int] = []
    with pytest.raises(ConnectionError):
        await _charging_agent(store, charges, agent_name='orders').run('Charge order 42', run_id='order-42')
    result = await _charging_agent(store, charges, agent_name='orders').run('Charge order 42', run_id='order-42')
    assert (result.output, charges) == ('paid', [1250, 1250])

    record = await store.get_run(run_id='order-42')
    assert record is not None and record.agent_name == 'orders'
    assert [run.run_id for run in await store.list_runs(agent_name='orders')] == ['order-42']
    workflow = await journal_for(store).get_workflow(workflow_id='order-42')
    assert workflow is not None and workflow.run_id == 'order-42'

    # The fallback a refused replay names finds the run under the id it was given.
    with pytest.raises(ReplayDivergedError) as refused:
        await _charging_agent(store, charges, agent_name='orders').run('Charge order 43', run_id='order-42')
    assert "continue_run(store, run_id='order-42')" in str(refused.value)
    continued = await continue_run(store, run_id='order-42')
    assert continued[-1].parts == result.all_messages()[-1].parts


async def test_an_explicit_record_id_other_than_the_workflow_id_is_refused_before_anything_is_written(
    store: StepStore,
) -> None:
    with pytest.raises(ValueError, match=r"recorded under its workflow id \('order-7'\)"):
        await _charging_agent(store, [], run_id='mine').run('Charge order 7', run_id='order-7')
    assert await store.list_runs() == []
    assert await journal_for(store).get_workflow(workflow_id='order-7') is None

    charges: list[int] = []
    with pytest.raises(ConnectionError):
        await _charging_agent(store, charges, run_id='order-8').run('Charge order 8', run_id='order-8')
    assert [run.run_id for run in await store.list_runs()] == ['order-8']


async def test_a_replay_of_a_run_that_ended_where_it_started_keeps_its_origin(store: StepStore) -> None:
    """A run given a history that ends in a call needing approval ends at once, its snapshot that history: its
    replay finds its own snapshot first, and still registers as the run it replays (continuing the first run)."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart('delete', {'path': '/tmp/x'}, tool_call_id='call-delete')])

    def delete(path: str) -> str:
        return f'deleted {path}'

    agent = Agent(
        FunctionModel(model),
        name='ops',
        tools=[Tool(delete, requires_approval=True)],
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store), StepDurability(store)],
    )
    asking = await agent.run('remove /tmp/x', run_id='ask-1')
    for _ in range(2):  # the run, then its replay
        again = await agent.run(message_history=asking.all_messages(), run_id='ask-2')
        assert isinstance(again.output, DeferredToolRequests)
    record = await store.get_run(run_id='ask-2')
    assert record is not None and record.origin is not None
    assert (record.origin.kind, record.origin.run_id) == ('continued', 'ask-1')


async def test_a_workflow_id_used_by_another_agent_is_refused_before_anything_runs(store: StepStore) -> None:
    charges: list[int] = []
    with pytest.raises(ConnectionError):
        await _charging_agent(store, charges).run('Charge order 42', run_id='order-42')
    assert (await _charging_agent(store, charges).run('Charge order 42', run_id='order-42')).output == 'paid'
    journal = journal_for(store)
    completed = await journal.get_workflow(workflow_id='order-42')
    assert completed is not None and completed.agent_name == 'orders'

    with pytest.raises(ReplayDivergedError, match="started by agent 'orders', and this is agent 'refunds'"):
        await _charging_agent(store, charges, name='refunds').run('Charge order 42', run_id='order-42')
    assert charges == [1250, 1250]  # nothing ran again
    assert await journal.get_workflow(workflow_id='order-42') == completed
    assert [run.agent_name for run in await store.list_runs()] == ['orders']
