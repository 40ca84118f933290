"""The inspector mounted under a path of an application's own Starlette app: every link, form, script
and stylesheet of every page stays under that path and answers, and the token's cookie is scoped to it."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import httpx2
import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from step_persistence import ContinuableSnapshot, InMemoryStepStore, RunRecord, StepStore
from step_persistence.inspector import create_app

pytestmark = pytest.mark.anyio

TOKEN = 'a-token-of-some-length'
PREFIX = '/tools/inspector'
LINK = re.compile(r'(?:href|src|action|data-state-url)="([^"]*)"')


@pytest.fixture
async def store() -> AsyncIterator[StepStore]:
    async with InMemoryStepStore() as opened:
        await opened.register_run(RunRecord(run_id='r', agent_name='agent', conversation_id='c'))
        messages = [ModelRequest(parts=[UserPromptPart('go')]), ModelResponse(parts=[TextPart('done')])]
        await opened.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages))
        yield opened


def application(store: StepStore) -> Starlette:
    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse('the application')

    return Starlette(routes=[Route('/', home), Mount(PREFIX, app=create_app(store, token=TOKEN))])


async def crawl(http: httpx2.AsyncClient, start: str) -> dict[str, int]:
    """Every same-site address reachable from `start`, with the status it answered."""
    seen: dict[str, int] = {}
    queue = [start]
    while queue:
        address = queue.pop()
        if address in seen:
            continue
        response = await http.get(address)
        seen[address] = response.status_code
        if response.headers.get('content-type', '').startswith('text/html'):
            queue.extend(html.unescape(link) for link in LINK.findall(response.text) if link.startswith('/'))
    return seen


async def test_every_page_links_under_the_mount_path(store: StepStore) -> None:
    transport = httpx2.ASGITransport(app=application(store))
    async with httpx2.AsyncClient(transport=transport, base_url='http://127.0.0.1:8765') as http:
        entered = await http.get(f'{PREFIX}/?token={TOKEN}')
        assert entered.status_code == 303
        assert entered.headers['location'] == f'{PREFIX}/'
        assert f'Path={PREFIX}' in entered.headers['set-cookie']
        http.cookies.update(entered.cookies)

        seen = await crawl(http, f'{PREFIX}/')

    assert (await_root := [address for address in seen if not address.startswith(f'{PREFIX}/')]) == [], await_root
    assert {address for address, status in seen.items() if status != 200} == set()
    pages = {address.partition('?')[0] for address in seen}
    assert {f'{PREFIX}/', f'{PREFIX}/run', f'{PREFIX}/conversations', f'{PREFIX}/conversation'} <= pages
    assert {f'{PREFIX}/static/inspector.css', f'{PREFIX}/static/inspector.js', f'{PREFIX}/run/state'} <= pages


async def test_at_the_server_root_links_start_at_the_root(store: StepStore) -> None:
    transport = httpx2.ASGITransport(app=create_app(store))
    async with httpx2.AsyncClient(transport=transport, base_url='http://127.0.0.1:8765') as http:
        seen = await crawl(http, '/')
    assert {address for address, status in seen.items() if status != 200} == set()
    assert {'/', '/run', '/conversations', '/static/inspector.css'} <= {address.partition('?')[0] for address in seen}
