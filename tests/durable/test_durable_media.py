"""Media in journal payloads: a unit's result keeps its media in the store's media store, as a snapshot does.

The agents run without `StepPersistence`, so the journal is the only thing referring to the blobs:
`collect_media` must keep them, and a replay must read them back intact.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_persistence import from_spec
from step_persistence.durable import StepDurability, journal_for
from step_persistence.media import MediaContext
from step_persistence.reclaiming import uris_in
from support.backends import BACKENDS, BackendSession, spec_of

pytestmark = pytest.mark.anyio

IMAGE = bytes(range(256)) * 64
"""What the tool returns, as a `BinaryContent` (every binary payload is externalized, whatever its size)."""
REPORT = 'the chart shows growth. ' * 3000
"""The final answer: a text above the stores' default threshold (64 KiB)."""


@pytest.fixture(params=['file', 'mongo', 'postgres', 'sqlite'])
async def session(request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    async with BACKENDS[request.param].open(request) as opened:
        yield opened


def _images(messages: list[ModelMessage]) -> list[bytes]:
    """The binary payloads the model is sent (a tool's `BinaryContent` return, wherever pydantic-ai puts it)."""
    found: list[bytes] = []
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            contents: Any = part.content if isinstance(part, UserPromptPart | ToolReturnPart) else None
            for content in contents if isinstance(contents, list) else [contents]:
                if isinstance(content, BinaryContent):
                    found.append(content.data)
    return found


def _agent(store: Any, calls: Counter[str], seen: list[list[bytes]], stop: asyncio.Event | None) -> Agent[None, str]:
    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls['model'] += 1
        if calls['model'] == 1 and not _images(messages):
            return ModelResponse(parts=[ToolCallPart('chart', {}, tool_call_id='call-chart')])
        seen.append(_images(messages))
        if stop is not None:
            stop.set()
            await asyncio.Event().wait()  # the run is stopped here
        return ModelResponse(parts=[TextPart(REPORT)])

    def chart() -> BinaryContent:
        calls['chart'] += 1
        return BinaryContent(data=IMAGE, media_type='image/png')

    return Agent(FunctionModel(model), name='charts', tools=[chart], capabilities=[StepDurability(store)])


async def test_journal_payloads_keep_their_media_in_the_media_store(session: BackendSession) -> None:
    async with from_spec(**spec_of(session)) as store:
        await _replay_with_media(session, store)
    async with from_spec(**spec_of(session, media_store=None)) as inline:
        with pytest.raises(ValueError, match=r'keeps its media in a media store, and this store was opened without'):
            await _agent(inline, Counter(), [], None).run('Draw the chart', run_id='chart-1')


async def _replay_with_media(session: BackendSession, store: Any) -> None:
    assert store.media_store is not None
    journal = journal_for(store)

    calls: Counter[str] = Counter()
    seen: list[list[bytes]] = []
    stop = asyncio.Event()
    run = asyncio.create_task(_agent(store, calls, seen, stop).run('Draw the chart', run_id='chart-1'))
    await stop.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert seen == [[IMAGE]]
    [tool_unit] = [unit for unit in await journal.list_units(workflow_id='chart-1') if unit.kind == 'tool']
    assert tool_unit.status == 'completed' and tool_unit.externalized
    assert len(json.dumps(tool_unit.result)) < len(IMAGE), 'the image is in the media store, not in the journal'
    [uri] = uris_in(json.dumps(tool_unit.result))
    assert await store.media_store.get(uri, context=MediaContext(media_type='image/png')) == IMAGE
    collected = await store.collect_media(grace=timedelta(0))
    assert collected.blobs == 0, 'the journal refers to the blob'

    resumed: Counter[str] = Counter()
    seen_resumed: list[list[bytes]] = []
    result = await _agent(store, resumed, seen_resumed, None).run('Draw the chart', run_id='chart-1')
    assert result.output == REPORT
    assert resumed == {'model': 1}, 'the first request and the tool replayed; the request in flight ran again'
    assert seen_resumed == [[IMAGE]], "the replayed tool's image came back intact"
    units = {unit.unit_key: unit for unit in await journal.list_units(workflow_id='chart-1')}
    final = [unit for unit in units.values() if unit.kind == 'model' and unit.externalized]
    assert len(final) == 1 and REPORT not in json.dumps(final[0].result), 'the long answer is a blob too'

    assert (await store.collect_media(grace=timedelta(0))).blobs == 0
    again: Counter[str] = Counter()
    replayed = await _agent(store, again, [], None).run('Draw the chart', run_id='chart-1')
    assert (replayed.output, again) == (REPORT, Counter()), 'a whole replay reads every payload back'
