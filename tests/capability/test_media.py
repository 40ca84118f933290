"""Large tool payloads on a real agent: stored once in the backend's media store, restored byte for byte."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelMessagesTypeAdapter, ToolReturnPart

from step_persistence import InMemoryStepStore, StepPersistence
from support.backends import Backend, BackendSession
from support.scripted import calls, scripted, text, turn_step

pytestmark = pytest.mark.anyio

STEPS = 10
_random = random.Random(5)
IMAGE = _random.randbytes(5 * 1024 * 1024)
"""5 MB that compress to nothing useful, like a real image."""
REPORT = ''.join(_random.choices('abcdefghij ✓—東京\n', k=700_000))
"""A string of over 1 MB in UTF-8 (multi-byte characters included)."""


def tool_returns(messages: list[ModelMessage]) -> list[Any]:
    return [part.content for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]


async def test_large_payloads_are_stored_once_and_restored_exactly(
    backend: Backend, backend_session: BackendSession
) -> None:
    assert len(REPORT.encode()) > 1_000_000
    store = await backend_session.make(max_snapshots_per_run=3)

    def respond(history: list[ModelMessage]) -> Any:
        step = turn_step(history)
        return calls(('fetch', {'n': step}, f'fetch-{step}')) if step < STEPS else text('all fetched')

    agent = Agent(scripted(respond), capabilities=[StepPersistence(store=store, run_id='fetcher')])

    @agent.tool_plain
    def fetch(n: int) -> list[Any]:
        return [BinaryContent(data=IMAGE, media_type='image/png'), REPORT]

    result = await agent.run('fetch the report ten times')

    latest = await store.latest_snapshot(run_id='fetcher')
    assert latest is not None
    returns = tool_returns(latest.messages)
    assert len(returns) == STEPS
    for image, report in returns:
        assert isinstance(image, BinaryContent) and image.media_type == 'image/png'
        assert image.data == IMAGE and report == REPORT
    adapter = ModelMessagesTypeAdapter
    assert adapter.dump_json(latest.messages) == adapter.dump_json(result.all_messages()), 'identical, byte for byte'
    oldest = (await store.list_snapshots(run_id='fetcher'))[0]
    assert oldest.seq > 1, 'retention pruned the early snapshots'
    assert all(image.data == IMAGE and report == REPORT for image, report in tool_returns(oldest.messages))

    if isinstance(store, InMemoryStepStore):
        return  # payloads stay inline in memory (specification, section 8)
    assert backend_session.count_media_blobs is not None, (
        f'the {backend.name} backend must say how to count its media blobs '
        '(count_media_blobs in tests/support/backends.py)'
    )
    assert await backend_session.count_media_blobs() == 2, 'the image and the report, once each, never pruned'
