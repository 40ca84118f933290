"""A real MCP server's tool under `StepDurability`: journaled, and replayed without calling the server.

The server (tests/support/mcp_catalog_server.py) runs over stdio in its own process, as pydantic-ai's
`MCPToolset` runs one, and writes a line per call it serves, so the counts are of what the server did.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_persistence import StepPersistence, StepStore
from step_persistence.durable import journal_for
from step_persistence.durable.engine import StepDurability
from support.backends import BACKENDS

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).resolve().parents[1] / 'support' / 'mcp_catalog_server.py'


@pytest.fixture(params=['file', 'memory', 'mongo', 'postgres', 'sqlite'])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StepStore]:
    async with BACKENDS[request.param].open(request) as session:
        yield await session.make()


class Catalog:
    """The scripted model and the MCP server of one test, with what each really ran."""

    def __init__(self, directory: Path) -> None:
        self.served = directory / 'served'
        self.model_calls = 0
        self.answering = asyncio.Event()
        """Set once the final model request is inside (with `hang_in_answer`, it then waits forever)."""

    def server_calls(self) -> list[str]:
        return self.served.read_text().splitlines() if self.served.exists() else []

    def agent(self, store: StepStore, *, hang_in_answer: bool = False) -> Agent[None, str]:
        async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            self.model_calls += 1
            if len(messages) == 1:
                return ModelResponse(parts=[ToolCallPart('lookup', {'q': 'lamp'}, tool_call_id='call-lookup')])
            if hang_in_answer:
                self.answering.set()
                await asyncio.Event().wait()
            returned = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
            return ModelResponse(parts=[TextPart(f'catalog says: {returned[0].content}')])

        transport = StdioTransport(command=sys.executable, args=[str(SERVER)], env={'CATALOG_CALLS': str(self.served)})
        return Agent(
            FunctionModel(model),
            name='catalog',
            toolsets=[MCPToolset(transport, id='catalog')],
            capabilities=[StepPersistence(store=store), StepDurability(store)],
        )


async def test_an_mcp_tool_call_is_journaled_and_a_finished_run_replays_without_the_server(
    store: StepStore, tmp_path: Path
) -> None:
    catalog = Catalog(tmp_path)
    first = await catalog.agent(store).run('Do you have a lamp?', run_id='mcp-1')
    assert first.output == 'catalog says: found lamp'
    assert (catalog.model_calls, catalog.server_calls()) == (2, ['lamp'])

    again = await catalog.agent(store).run('Do you have a lamp?', run_id='mcp-1')
    assert again.output == first.output
    assert (catalog.model_calls, catalog.server_calls()) == (2, ['lamp']), 'no model request, no call to the server'
    units = await journal_for(store).list_units(workflow_id='mcp-1')
    tool_units = [unit for unit in units if unit.kind == 'tool']
    assert [(unit.tool_call_id, unit.status) for unit in tool_units] == [('call-lookup', 'completed')]
    assert Counter(unit.kind for unit in units)['model'] == 2
    effects = await store.list_tool_effects(run_id='mcp-1')
    assert [(effect.tool_name, effect.status) for effect in effects] == [('lookup', 'completed')]


async def test_a_run_stopped_after_its_mcp_call_resumes_without_calling_the_server_again(
    store: StepStore, tmp_path: Path
) -> None:
    catalog = Catalog(tmp_path)
    run = asyncio.create_task(catalog.agent(store, hang_in_answer=True).run('Do you have a lamp?', run_id='mcp-2'))
    await catalog.answering.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert (catalog.model_calls, catalog.server_calls()) == (2, ['lamp'])

    resumed = await catalog.agent(store).run('Do you have a lamp?', run_id='mcp-2')
    assert resumed.output == 'catalog says: found lamp'
    assert catalog.server_calls() == ['lamp'], 'the completed MCP call replayed from the journal'
    assert catalog.model_calls == 3, 'the first request replayed; only the one in flight ran again'
    assert [run.run_id for run in await store.list_runs()] == ['mcp-2'], 'one record'
