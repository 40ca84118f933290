"""`runs messages RUN [--seq N] [--json]`: a snapshot's history as text or JSON, media as media URIs (issue 18,
item 13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart

from step_persistence import ContinuableSnapshot, RunRecord, from_spec
from step_persistence.media import media_uri_for
from support.console_script import cli

pytestmark = pytest.mark.anyio

IMAGE = b'\x89PNG\r\n\x1a\n' + bytes(range(256)) * 8
MARKUP = '[bold red]not markup[/bold red] and [link=x]'


@pytest.fixture(params=['file', 'sqlite'])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f'file://{tmp_path / "runs"}' if request.param == 'file' else f'sqlite:///{tmp_path / "runs.db"}'


async def test_history_as_text_and_json(store_url: str) -> None:
    first = ModelRequest(parts=[UserPromptPart(['Describe this image', BinaryContent(IMAGE, media_type='image/png')])])
    answer = ModelResponse(parts=[ToolCallPart('lookup', {'query': MARKUP}, 'call-1'), TextPart(MARKUP)])
    async with from_spec(store_url) as store:
        await store.register_run(RunRecord(run_id='vision-run'))
        await store.register_run(RunRecord(run_id='empty-run'))
        await store.save_snapshot(ContinuableSnapshot(run_id='vision-run', step_index=1, messages=[first]))
        await store.save_snapshot(
            ContinuableSnapshot(run_id='vision-run', step_index=2, messages=[first, answer], state='interrupted')
        )

    newest = json.loads(cli('runs', 'messages', 'vision', '--store', store_url, '--json').stdout)
    assert (newest['run_id'], newest['seq'], newest['state']) == ('vision-run', 2, 'interrupted')
    assert newest['step_index'] == 2
    assert newest['timestamp'].endswith('Z')
    prompt = newest['messages'][0]['parts'][0]['content']
    assert prompt[0] == 'Describe this image'
    assert prompt[1]['data'] == {'media_uri': media_uri_for(IMAGE), 'size': len(IMAGE)}
    assert prompt[1]['media_type'] == 'image/png'
    assert newest['messages'][1]['parts'][0]['args'] == {'query': MARKUP}
    assert newest['messages'][1]['parts'][1]['content'] == MARKUP
    assert newest['messages'][0]['parts'][0]['timestamp'].endswith('Z')

    first_only = json.loads(cli('runs', 'messages', 'vision-run', '--seq', '1', '--store', store_url, '--json').stdout)
    assert first_only['seq'] == 1 and len(first_only['messages']) == 1

    text = cli('runs', 'messages', 'vision-run', '--store', store_url).stdout
    assert 'snapshot 2 (2 retained): interrupted' in text
    assert f'<media {media_uri_for(IMAGE)} image/png, {len(IMAGE)} bytes>' in text
    assert MARKUP in text, 'stored strings are printed as they are, never as markup'
    assert 'tool-call lookup (call-1)' in text and 'user-prompt' in text
    assert '\\x89PNG' not in text and 'iVBOR' not in text, 'no bytes, no base64'

    missing = cli('runs', 'messages', 'vision-run', '--seq', '7', '--store', store_url, expect=3)
    assert 'no snapshot 7' in missing.stderr and 'retained: 1, 2' in missing.stderr
    assert 'no snapshot' in cli('runs', 'messages', 'empty-run', '--store', store_url, expect=3).stderr
    cli('runs', 'messages', 'nothing-like-it', '--store', store_url, expect=3)
