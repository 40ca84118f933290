"""Defects of durable replay found by a user's audit, each a strict xfail until it is fixed.

Each test states what docs/durable.md promises (or a user would expect) and fails on what happens now;
a fix makes it pass, and strict xfail then fails the suite until its marker is removed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, Tool
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_persistence import StepPersistence, StepStore
from step_persistence.durable import recover_abandoned
from step_persistence.durable.engine import StepDurability
from support.backends import BACKENDS
from support.durable_agents import Counted, abandon_inside_charge

pytestmark = pytest.mark.anyio


@pytest.fixture(params=['memory', 'sqlite'])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StepStore]:
    async with BACKENDS[request.param].open(request) as session:
        yield await session.make()


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

    async def delete(path: str) -> str:
        counted.charges += 1
        counted.inside.set()
        if counted.release is not None:
            await counted.release.wait()
        return f'deleted {path}'

    tool = Tool(delete, requires_approval=True, metadata={'step_persistence': {'idempotent': True}})
    return Agent(
        FunctionModel(model),
        name='ops',
        tools=[tool],
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store), StepDurability(store)],
    )


@pytest.mark.xfail(
    strict=True,
    reason='deferred_tool_results are not among the inputs a workflow records: recovery resumes without them',
)
async def test_a_run_continued_with_deferred_tool_results_is_recovered_with_them(store: StepStore) -> None:
    asking = await _approval_agent(store, Counted()).run('remove /tmp/x', run_id='ask-1')
    assert isinstance(asking.output, DeferredToolRequests)
    first = Counted()
    approved = DeferredToolResults(approvals={'call-delete': True})
    run = _approval_agent(store, first).run(
        message_history=asking.all_messages(), deferred_tool_results=approved, run_id='approved-1'
    )
    await abandon_inside_charge(store, run, first, 'approved-1')
    assert first.charges == 1

    again = Counted()
    [recovery] = await recover_abandoned(store, agents=[_approval_agent(store, again)])
    # The approval the run was given is part of what it was started with: the resumed run runs the approved
    # call (it is idempotent) and answers, rather than asking for the approval again.
    assert (recovery.outcome, recovery.output) == ('resumed', 'result: deleted /tmp/x')
    assert again.charges == 1
