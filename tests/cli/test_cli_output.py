"""What the command line prints reads the same everywhere (issue 18, item 12): one spelling of an instant in
every JSON output, help that names its arguments plainly, and the docs' revision numbers kept true."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_cli_store_urls import commands

from step_persistence import RunRecord, StepEvent, ToolEffectRecord, from_spec
from step_persistence.stores.sql.migrate import head_revision
from support.console_script import cli

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ROOT / 'src' / 'step_persistence' / 'migrations' / 'versions'
LOOKS_LIKE_AN_INSTANT = re.compile(r'^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}')
THE_SPELLING = re.compile(r'^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$')


def instants(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if LOOKS_LIKE_AN_INSTANT.match(value) else []
    if isinstance(value, dict):
        return [found for item in value.values() for found in instants(item)]
    if isinstance(value, list):
        return [found for item in value for found in instants(item)]
    return []


@pytest.fixture(params=['file', 'sqlite'])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f'file://{tmp_path / "runs"}' if request.param == 'file' else f'sqlite:///{tmp_path / "runs.db"}'


async def test_every_json_output_spells_instants_one_way(store_url: str) -> None:
    async with from_spec(store_url) as store:
        await store.register_run(RunRecord(run_id='parent', conversation_id='chat'))
        await store.register_run(RunRecord(run_id='child', parent_run_id='parent'))
        for run_id in ('parent', 'child'):
            await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
        await store.record_tool_effect(
            ToolEffectRecord(run_id='child', tool_call_id='call-1', tool_name='charge_card', status='started')
        )
        await store.append_event(StepEvent(run_id='parent', kind='run_completed', step_index=1))

    outputs = {
        'runs list': cli('runs', 'list', '--store', store_url, '--json').stdout,
        'runs show': cli('runs', 'show', 'child', '--store', store_url, '--json').stdout,
        'runs tree': cli('runs', 'tree', 'parent', '--store', store_url, '--json').stdout,
        'runs unresolved': cli('runs', 'unresolved', '--store', store_url, '--json').stdout,
        'report': cli('report', '--store', store_url, '--json').stdout,
        'conversations list': cli('conversations', 'list', '--store', store_url, '--json').stdout,
        'conversations show': cli('conversations', 'show', 'chat', '--store', store_url, '--json').stdout,
        'prune': cli('prune', '--older-than', '30d', '--dry-run', '--store', store_url, '--json').stdout,
    }
    for command, printed in outputs.items():
        found = instants(json.loads(printed))
        assert found, f'{command} printed no instant'
        assert all(THE_SPELLING.match(moment) for moment in found), (command, found)


def test_help_reads_plainly() -> None:
    for words in commands():
        help_text = cli(*words, '--help').stdout
        assert '<bool>' not in help_text and '{' not in help_text, (words, help_text)
        if words[0] == 'runs' and words[1] not in ('list', 'unresolved'):
            assert re.search(r'Usage: step-persistence runs \w+ \[OPTIONS\] RUN\b', help_text), help_text
    assert 'Usage: step-persistence conversations show [OPTIONS] ID' in cli('conversations', 'show', '--help').stdout
    assert 'RUN CALL' in cli('runs', 'resolve', '--help').stdout
    assert '--store' in cli('demo', '--help').stdout


def test_db_current_does_not_promise_to_create_the_schema() -> None:
    assert 'created if missing' not in cli('db', 'current', '--help').stdout
    for command in ('upgrade', 'downgrade', 'stamp'):
        assert 'created if missing' in cli('db', command, '--help').stdout, command


def history() -> list[str]:
    """The revisions of the packaged migrations, oldest first (from the files, as a reader of the docs sees them)."""
    revisions = {}
    for path in VERSIONS.glob('v*.py'):
        text = path.read_text()
        revision = re.search(r"^revision = '(\d{4})'", text, re.MULTILINE)
        down = re.search(r"^down_revision: str \| None = (None|'(\d{4})')", text, re.MULTILINE)
        assert revision and down, path
        revisions[revision.group(1)] = down.group(2)
    ordered = [next(rev for rev, down in revisions.items() if down is None)]
    while (after := [rev for rev, down in revisions.items() if down == ordered[-1]]) != []:
        ordered.extend(after)
    assert sorted(ordered) == sorted(revisions), 'one linear history'
    return ordered


def test_the_docs_revision_numbers_match_the_migration_history() -> None:
    revisions = history()
    head = revisions[-1]
    assert head == head_revision()
    following = f'{int(head) + 1:04d}'
    pages = {path.name: path.read_text() for path in sorted(ROOT.joinpath('docs').glob('*.md'))}
    for name, text in pages.items():
        for mentioned in re.findall(r'(?<![\w.:+-])(0\d{3})(?!\w)', text):
            assert mentioned in revisions or mentioned == following, f'{name} names revision {mentioned}, unknown'
        for shown in re.findall(r'"head": "(\d{4})"', text):
            assert shown == head, f'{name} shows the head as {shown}; it is {head}'
        for suggested in re.findall(r'--rev-id (\d{4})', text):
            assert suggested == following, f'{name} suggests --rev-id {suggested}; the next free one is {following}'
    described = pages['sql.md']
    for revision in revisions:
        assert f'`{revision}`' in described, f'docs/sql.md does not describe revision {revision}'
