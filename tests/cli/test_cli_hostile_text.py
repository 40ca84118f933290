"""Stored text is shown, never obeyed: markup, links, escape sequences and bidirectional overrides from a model.

Every read command prints a store whose ids, names, errors and summaries hold such text (and a
fork of the run into another conversation, both named so); each exits 0, shows the text
literally, and sends the terminal no control character of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, TokenUsage, ToolEffectRecord, from_spec
from step_persistence.records import RunOrigin
from step_persistence.testing.conformance import sample_history
from support.console_script import cli

pytestmark = pytest.mark.anyio

RUN_ID = 'run\x1b[31mred'
AGENT = 'agent[/x]'
CONVERSATION = '[link=https://example.invalid]click[/link]'
CALL = 'call[/b]\u202egnp.exe'
TOOL = 'tool[bold]x'
ERROR = 'No such file: [/data/in.csv] \x1b]8;;https://example.invalid\x07here\x1b]8;;\x07 \r\x07done'
SUMMARY = 'summary\x9b31m [red]not red[/red]'
FORK = 'fork\x1b]8;;https://example.invalid\x07[b]'
ELSEWHERE = '[bold]other\u202e'
MODEL = 'model[/i]\x1b[2J'
COMMANDS = [
    ['runs', 'list'],
    ['runs', 'show', 'run'],
    ['runs', 'tree', 'run'],
    ['runs', 'unresolved'],
    ['runs', 'messages', 'run'],
    ['report'],
    ['conversations', 'list'],
    ['conversations', 'show', '[link'],
    ['conversations', 'show', ELSEWHERE],
]
FORK_SHOWN = 'fork\\x1b]8;;https://example.invalid\\x07[b]'
ELSEWHERE_SHOWN = '[bold]other\\u202e'
ALSO_SHOWN = {
    ('runs', 'show', 'run'): [FORK_SHOWN, 'model[/i]\\x1b[2J'],
    ('runs', 'tree', 'run'): [FORK_SHOWN],
    ('conversations', 'list'): [ELSEWHERE_SHOWN, 'runs'],
    ('conversations', 'show', ELSEWHERE): [ELSEWHERE_SHOWN, FORK_SHOWN, 'in another conversation'],
}
"""Lineage (the fork and its conversation) and model names a command prints besides the run, escaped."""


@pytest.fixture
async def store_url(tmp_path: Path) -> str:
    url = f'sqlite:///{tmp_path / "hostile.db"}'
    async with from_spec(url) as store:
        await store.register_run(RunRecord(run_id=RUN_ID, agent_name=AGENT, conversation_id=CONVERSATION))
        usage = TokenUsage(input_tokens=12, output_tokens=3, cache_read_tokens=0, cache_write_tokens=0)
        await store.append_event(
            StepEvent(run_id=RUN_ID, kind='model_request_completed', step_index=1, model_name=MODEL, usage=usage)
        )
        await store.append_event(
            StepEvent(run_id=RUN_ID, kind='tool_call_started', step_index=1, tool_call_id=CALL, tool_name=TOOL)
        )
        await store.record_tool_effect(
            ToolEffectRecord(run_id=RUN_ID, tool_call_id=CALL, tool_name=TOOL, status='started', effect_summary=SUMMARY)
        )
        await store.save_snapshot(
            ContinuableSnapshot(run_id=RUN_ID, step_index=1, messages=sample_history(1, tag=ERROR))
        )
        await store.append_event(StepEvent(run_id=RUN_ID, kind='run_failed', step_index=2, error=ERROR))
        await store.register_run(
            RunRecord(
                run_id=FORK,
                agent_name=AGENT,
                conversation_id=ELSEWHERE,
                origin=RunOrigin(kind='forked', run_id=RUN_ID, seq=1),
            )
        )
    return url


@pytest.mark.parametrize('command', COMMANDS, ids=' '.join)
async def test_stored_text_is_shown_literally_and_never_reaches_the_terminal_as_control(
    command: list[str], store_url: str
) -> None:
    completed = cli(*command, '--store', store_url)
    output = completed.stdout + completed.stderr
    assert not any(ord(character) < 0x20 and character not in '\n' for character in output), repr(output)
    assert not any(0x7F <= ord(character) <= 0x9F or character == '\u202e' for character in output), repr(output)
    assert 'run\\x1b[31mred' in output, 'the run id is shown, its escape character made visible'
    for shown in ALSO_SHOWN.get(tuple(command), ()):
        assert shown in output, f'{shown} is shown too, escaped'


async def test_markup_in_stored_text_is_text_even_on_a_colour_terminal(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv('FORCE_COLOR', '1')
    shown = cli('runs', 'show', 'run', '--store', store_url).stdout
    unresolved = cli('runs', 'unresolved', '--store', store_url).stdout
    assert '\x1b]8;' not in shown + unresolved, 'no hyperlink is emitted'
    assert 'agent[/x]' in shown and '[/data/in.csv]' in shown
    assert '[red]not red[/red]' in unresolved
    assert os.environ['FORCE_COLOR'] == '1'
