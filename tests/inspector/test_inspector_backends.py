"""Every page of the inspector works on every backend of the registry (SQLite, PostgreSQL, MongoDB, files, memory),
and leaves a file store's directory as it found it (the SQL and MongoDB stores are shown to be sent
reads only in test_inspector_bounded_reads.py).

No browser here: the application is called in the test's event loop (the store's) through
httpx2's ASGI transport, on the scenario written by scripted agents (without the 500 fillers).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from step_persistence import FileStepStore, StepStore
from step_persistence.inspector import create_app
from step_persistence.inspector.media import blob_digest
from support.backends import StoreMaker
from support.inspector_scenario import XSS, Scenario, png, scenario_pages, write_scenario

pytestmark = pytest.mark.anyio

STORE_URL = 'postgresql://inspector:hunter2-secret@db.internal:5432/runs?sslpassword=other-secret'
SECRETS = ('hunter2-secret', 'other-secret')


@pytest.fixture
async def filled(make_store: StoreMaker) -> AsyncIterator[tuple[StepStore, Scenario]]:
    store = await make_store()
    scenario = await write_scenario(store, crash_spec=None, fillers=3)
    yield store, scenario
    scenario.release()
    await scenario.held_task


async def test_every_page_answers_on_every_backend(filled: tuple[StepStore, Scenario]) -> None:
    store, _ = filled
    app = create_app(store, store_url=STORE_URL)
    pages: list[str] = []
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url='http://inspector') as client:

        async def get(path: str, **params: str | int) -> httpx2.Response:
            response = await client.get(path, params=params)
            assert response.status_code == 200, (path, params, response.text[:500])
            pages.append(response.text)
            return response

        listing = await get('/')
        for run_id in ('orchestrator-run', 'researcher-run', 'image-run', 'xss-run', 'mailer-run', 'held-run'):
            assert f'data-run-id="{run_id}"' in listing.text
        assert 'badge-failed' in (await get('/', status='failed')).text
        run = await get('/run', id='orchestrator-run')
        events = await store.list_events(run_id='orchestrator-run')
        usages = [event.usage for event in events if event.usage is not None]
        tokens_in, tokens_out = sum(u.input_tokens for u in usages), sum(u.output_tokens for u in usages)
        assert len(usages) == 2 and tokens_in > 0
        assert f'{tokens_in} / {tokens_out}' in listing.text, 'the run list shows the tokens its events recorded'
        assert f'{tokens_in} in, {tokens_out} out' in run.text
        for usage in usages:
            assert f'{usage.input_tokens} in / {usage.output_tokens} out tokens' in run.text
        answered = [event.model_name for event in events if event.usage is not None]
        assert run.text.count(f'<span class="model">{answered[0]}</span>') == len(answered)
        assert 'researcher-run' in run.text and 'follow-up-run' in run.text and 'fork-run' in run.text
        assert 'continue_run(store, run_id=&#39;orchestrator-run&#39;, seq=' in run.text
        xss = await get('/run', id='xss-run')
        assert XSS not in xss.text and '&lt;script&gt;window.__xss' in xss.text
        [snapshot] = (await store.list_snapshots(run_id='image-run', include_interrupted=True))[-1:]
        messages = await get('/run/messages', id='image-run', seq=snapshot.seq or 0)
        assert 'figure class="media media-inline"' in messages.text
        blob = await get('/media', run='image-run', seq=snapshot.seq or 0, digest=blob_digest(png()))
        assert blob.content == png() and blob.headers['content-type'] == 'image/png'
        state = (await get('/run/state', id='held-run')).json()
        assert state['status'] == 'crashed' and state['unresolved'] == 1
        assert 'orchestrator-run' in (await get('/conversation', id='conv-research')).text
        assert 'conv-charts' in (await get('/conversations')).text
        missing = await client.get('/run', params={'id': 'no-such-run'})
        assert missing.status_code == 404
        pages.append(missing.text)
    assert 'db.internal' in listing.text, 'the store is named'
    assert not [secret for secret in SECRETS for page in pages if secret in page], 'no password on any page'


def _tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every file and directory under `root`: its modification time and the SHA-256 of its bytes."""
    return {
        str(path.relative_to(root)): (
            path.stat().st_mtime_ns,
            hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else 'directory',
        )
        for path in sorted(root.rglob('*'))
    }


async def test_no_page_writes_to_a_file_store(tmp_path: Path) -> None:
    directory = tmp_path / 'runs'
    async with FileStepStore(directory) as store:
        scenario = await write_scenario(store, crash_spec=None, fillers=3)
        try:
            before = _tree(directory)
            async with httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=create_app(store)), base_url='http://inspector'
            ) as client:
                for address in await scenario_pages(store):
                    assert (await client.get(address)).status_code == 200, address
            assert _tree(directory) == before
        finally:
            scenario.release()
            await scenario.held_task
