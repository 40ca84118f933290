"""Safe by default (issue 20, item 2), checked on the application itself: read-only, same host, tokened,
strict headers, and stored media that cannot run as a page of the inspector's origin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, ToolReturnPart, UserPromptPart

from step_persistence import ContinuableSnapshot, InMemoryStepStore, RunRecord, StepStore
from step_persistence.inspector import create_app
from step_persistence.inspector.binding import BindRefused, check_bind, is_loopback
from step_persistence.inspector.guard import CONTENT_SECURITY_POLICY, COOKIE_NAME
from step_persistence.inspector.media import blob_digest

pytestmark = pytest.mark.anyio

TOKEN = 'a-token-of-some-length'
HTML = b'<html><script>alert(1)</script></html>'
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>'
PAGES = ['/', '/run?id=r', '/run/state?id=r', '/run/messages?id=r&seq=1', '/conversations', '/static/inspector.js']


@pytest.fixture
async def store() -> AsyncIterator[StepStore]:
    async with InMemoryStepStore() as opened:
        await opened.register_run(RunRecord(run_id='r', agent_name='agent'))
        parts = [
            ToolReturnPart('fetch', BinaryContent(HTML, media_type='text/html'), 'c1'),
            ToolReturnPart('draw', BinaryContent(SVG, media_type='image/svg+xml'), 'c2'),
            ToolReturnPart('odd', BinaryContent(b'odd', media_type='image/png\r\nX-Injected: 1'), 'c3'),
        ]
        messages = [ModelRequest(parts=[UserPromptPart('go'), *parts])]
        await opened.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages))
        yield opened


def client(store: StepStore, **options: object) -> httpx2.AsyncClient:
    app = create_app(store, **options)  # type: ignore[arg-type]
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url='http://127.0.0.1:8765')


@pytest.mark.parametrize('method', ['POST', 'PUT', 'PATCH', 'DELETE'])
async def test_only_get_and_head_are_served(store: StepStore, method: str) -> None:
    async with client(store) as http:
        for path in PAGES:
            response = await http.request(method, path)
            assert response.status_code == 405, (method, path)
            assert response.headers['allow'] == 'GET, HEAD'
        assert (await http.head('/')).status_code == 200


async def test_every_response_carries_the_security_headers(store: StepStore) -> None:
    async with client(store) as http:
        for path in [*PAGES, '/no-such-page', '/run', '/?start=x', '/media?run=r&seq=1&digest=nope']:
            response = await http.get(path)
            assert response.headers['content-security-policy'] == CONTENT_SECURITY_POLICY, path
            assert response.headers['x-content-type-options'] == 'nosniff'
            assert response.headers['x-frame-options'] == 'DENY'
        assert (await http.get('/no-such-page')).status_code == 404
        assert (await http.get('/run')).status_code == 400
        assert (await http.get('/?start=x')).status_code == 400
        assert (await http.get('/?status=exploded')).status_code == 400
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and 'unsafe-inline' not in CONTENT_SECURITY_POLICY


async def test_a_page_asked_for_by_another_host_name_is_refused(store: StepStore) -> None:
    async with client(store, allowed_hosts=['127.0.0.1', 'localhost']) as http:
        assert (await http.get('/')).status_code == 200
        assert (await http.get('/', headers={'Host': 'localhost:8765'})).status_code == 200
        rebound = await http.get('/', headers={'Host': 'attacker.example:8765'})
        assert rebound.status_code == 400


async def test_the_token_is_taken_once_then_a_strict_http_only_cookie_stands_for_it(store: StepStore) -> None:
    async with client(store, token=TOKEN) as http:
        assert (await http.get('/')).status_code == 401
        assert (await http.get('/', params={'token': 'wrong-token-of-some-length'})).status_code == 401
        entry = await http.get('/run', params={'id': 'r', 'token': TOKEN})
        assert entry.status_code == 303
        assert entry.headers['location'] == '/run?id=r', 'the token leaves the address bar'
        cookie = entry.headers['set-cookie']
        assert cookie.startswith(f'{COOKIE_NAME}=')
        assert 'HttpOnly' in cookie and 'SameSite=strict' in cookie and 'Path=/' in cookie
        assert TOKEN not in cookie, 'the cookie holds a digest of the token, not the token'
        assert (await http.get('/run', params={'id': 'r'})).status_code == 200
        assert (await http.get('/static/inspector.css')).status_code == 200
    async with client(store, token=TOKEN) as stranger:
        stranger.cookies.set(COOKIE_NAME, 'forged')
        assert (await stranger.get('/')).status_code == 401


async def test_stored_media_never_runs_as_a_page(store: StepStore) -> None:
    async with client(store) as http:
        html = await http.get('/media', params={'run': 'r', 'seq': 1, 'digest': blob_digest(HTML)})
        assert html.content == HTML
        assert html.headers['content-type'].startswith('text/html')
        assert html.headers['content-disposition'].startswith('attachment')
        assert html.headers['content-security-policy'] == "default-src 'none'; sandbox"
        svg = await http.get('/media', params={'run': 'r', 'seq': 1, 'digest': blob_digest(SVG)})
        assert svg.headers['content-disposition'].startswith('attachment'), 'SVG can hold script: never inline'
        odd = await http.get('/media', params={'run': 'r', 'seq': 1, 'digest': blob_digest(b'odd')})
        assert odd.headers['content-type'] == 'application/octet-stream'
        assert 'x-injected' not in odd.headers
        page = await http.get('/run/messages', params={'id': 'r', 'seq': 1})
        assert '<img' not in page.text, 'only raster images are shown inline'
        assert page.text.count('class="media media-link"') == 3
        unknown = await http.get('/media', params={'run': 'r', 'seq': 1, 'digest': '0' * 64})
        assert unknown.status_code == 404


def test_binding_anywhere_but_loopback_needs_allow_remote_and_a_long_token() -> None:
    for host in ('127.0.0.1', '127.0.0.2', 'localhost', '::1', '[::1]'):
        assert is_loopback(host)
        check_bind(host, allow_remote=False, token=None)
    for host in ('0.0.0.0', '::', '192.168.1.20', 'example.com'):
        assert not is_loopback(host)
        with pytest.raises(BindRefused, match='--allow-remote'):
            check_bind(host, allow_remote=False, token=TOKEN)
        with pytest.raises(BindRefused, match='without a token'):
            check_bind(host, allow_remote=True, token=None)
        check_bind(host, allow_remote=True, token=TOKEN)
    with pytest.raises(BindRefused, match='at least 16'):
        check_bind('0.0.0.0', allow_remote=True, token='short')
    with pytest.raises(TypeError):
        check_bind('0.0.0.0', allow_remote='yes', token=TOKEN)  # type: ignore[arg-type]


async def test_create_app_checks_its_arguments(store: StepStore) -> None:
    with pytest.raises(TypeError, match='StepStore'):
        create_app(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='token'):
        create_app(store, token='')
    with pytest.raises(TypeError, match='token'):
        create_app(store, token=123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match='allowed_hosts'):
        create_app(store, allowed_hosts='localhost')
    with pytest.raises(ValueError, match='refresh_seconds'):
        create_app(store, refresh_seconds=0)


class _Unreachable(InMemoryStepStore):
    """A store whose reads fail the way a lost database connection does, naming its URL."""

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        raise ConnectionError('could not reach postgresql://inspector:hunter2-secret@db.internal/runs')

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        raise ConnectionError('could not reach postgresql://inspector:hunter2-secret@db.internal/runs')


async def test_a_store_that_cannot_be_read_gives_a_503_page_without_its_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with client(_Unreachable()) as http:
        for path in ('/', '/run?id=r', '/run/state?id=r', '/conversation?id=c'):
            response = await http.get(path)
            assert response.status_code == 503, path
            assert 'hunter2-secret' not in response.text and 'db.internal' in response.text, path
            assert response.headers['content-security-policy'] == CONTENT_SECURITY_POLICY
    assert 'the inspector could not read the store' in caplog.text
    assert 'hunter2-secret' not in caplog.text, 'nor in the log'
