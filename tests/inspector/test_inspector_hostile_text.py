"""Stored text is shown, never obeyed, on every page: markup, URL syntax, control characters and
bidirectional overrides from a model, in ids, names, errors, summaries and messages."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from markupsafe import escape
from pydantic_ai.messages import ImageUrl, ModelRequest, ToolReturnPart, UserPromptPart

from step_persistence import ContinuableSnapshot, InMemoryStepStore, RunRecord, StepEvent, StepStore, ToolEffectRecord
from step_persistence.inspector import create_app
from step_persistence.records import RunOrigin

pytestmark = pytest.mark.anyio

RUN_ID = 'run/../<b>x</b>?id=other&seq=1#top \x1b[31m'
AGENT = '<img src=x onerror=alert(1)>'
CONVERSATION = 'conv"><script>alert(2)</script>'
CALL = 'call\u202egnp.exe'
ERROR = 'boom </code><script>alert(3)</script>'
SUMMARY = "summary' onmouseover='alert(4)"
FORK = 'fork&amp;<i>'


@pytest.fixture
async def store() -> AsyncIterator[StepStore]:
    async with InMemoryStepStore() as opened:
        await opened.register_run(RunRecord(run_id=RUN_ID, agent_name=AGENT, conversation_id=CONVERSATION))
        await opened.append_event(
            StepEvent(run_id=RUN_ID, kind='tool_call_started', step_index=1, tool_call_id=CALL, tool_name=AGENT)
        )
        await opened.record_tool_effect(
            ToolEffectRecord(
                run_id=RUN_ID, tool_call_id=CALL, tool_name=AGENT, status='started', effect_summary=SUMMARY
            )
        )
        messages = [
            ModelRequest(
                parts=[
                    UserPromptPart([ERROR, ImageUrl('javascript:alert(5)//x.png')]),
                    ToolReturnPart(AGENT, ERROR, CALL),
                ]
            )
        ]
        await opened.save_snapshot(ContinuableSnapshot(run_id=RUN_ID, step_index=1, messages=messages))
        await opened.append_event(StepEvent(run_id=RUN_ID, kind='run_failed', step_index=2, error=ERROR))
        await opened.register_run(
            RunRecord(run_id=FORK, conversation_id=CONVERSATION, origin=RunOrigin(kind='forked', run_id=RUN_ID, seq=1))
        )
        yield opened


def _hrefs(page: str) -> list[str]:
    return [html.unescape(found) for found in re.findall(r'href="([^"]*)"', page)]


async def test_hostile_stored_text_is_shown_as_text_and_its_links_work(store: StepStore) -> None:
    app = create_app(store)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url='http://inspector') as http:
        listing = (await http.get('/')).text
        run_links = [href for href in _hrefs(listing) if href.startswith('/run?')]
        assert run_links, 'the run is linked'
        pages = [listing]
        for href in run_links:
            response = await http.get(href)
            assert response.status_code == 200, href
            pages.append(response.text)
        run_page = (await http.get('/run', params={'id': RUN_ID})).text
        messages = (await http.get('/run/messages', params={'id': RUN_ID, 'seq': 1})).text
        conversation = (await http.get('/conversation', params={'id': CONVERSATION})).text
        pages += [run_page, messages, conversation]
        assert (await http.get('/run', params={'id': FORK})).status_code == 200
    for page in pages:
        assert '<script>alert' not in page and '<img src=x' not in page and '<b>x</b>' not in page
        assert '\x1b' not in page and '\u202e' not in page, 'control characters and overrides are spelled out'
    assert 'run/../&lt;b&gt;x&lt;/b&gt;?id=other&amp;seq=1#top \\x1b[31m' in run_page
    assert 'call\\u202egnp.exe' in run_page
    assert str(escape(SUMMARY)) in run_page and str(escape(ERROR)) in run_page
    assert 'href="javascript:' not in messages.lower(), 'a URL of another scheme is not a link'
    assert 'javascript:alert(5)//x.png' in messages
    linked = [parse_qs(urlsplit(href).query)['id'][0] for href in _hrefs(conversation) if href.startswith('/run?')]
    assert RUN_ID in linked and FORK in linked
