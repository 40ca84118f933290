"""`StepPersistence` wraps the model of a request only when the request is streamed.

A streamed response can be complete before its handler returns (`run_stream` runs its final
response's calls first), so the stream is watched (`StreamWatch`); a request that is not streamed
hands its response to `wrap_model_request`, and its model is left unwrapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models import Model

from step_persistence import InMemoryStepStore, StepPersistence
from step_persistence._stream_watch import StreamWatch
from support.scripted import calls, scripted, text

pytestmark = pytest.mark.anyio


@dataclass
class ModelsServed(AbstractCapability[Any]):
    """Records the model each request is served by, as wrapped by the capabilities listed after it."""

    models: list[Model] = field(default_factory=list[Model])

    def get_wrapper_model(self, model: Model) -> Model | None:
        self.models.append(model)
        return None


def agent_with(served: ModelsServed, store: InMemoryStepStore) -> Agent[None, str]:
    model = scripted(calls(('lookup', {'key': 'a'}, 'lookup-1')), text('done'))
    agent = Agent(model, capabilities=[served, StepPersistence(store=store)])

    @agent.tool_plain
    def lookup(key: str) -> str:
        return f'value of {key}'

    return agent


async def test_a_request_that_is_not_streamed_is_served_by_the_model_itself() -> None:
    served, store = ModelsServed(), InMemoryStepStore()
    result = await agent_with(served, store).run('go')
    assert result.output == 'done'
    assert len(served.models) == 2
    assert not any(isinstance(model, StreamWatch) for model in served.models)
    (run,) = await store.list_runs()
    completed = [
        event for event in await store.list_events(run_id=run.run_id) if event.kind == 'model_request_completed'
    ]
    assert [event.model_name is not None for event in completed] == [True, True]


async def test_a_streamed_request_is_watched() -> None:
    served, store = ModelsServed(), InMemoryStepStore()
    async with agent_with(served, store).run_stream('go') as stream:
        assert await stream.get_output() == 'done'
    assert served.models
    assert all(isinstance(model, StreamWatch) for model in served.models)
