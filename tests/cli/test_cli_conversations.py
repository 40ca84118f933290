"""`conversations list` and `conversations show`, and the lineage `runs show` and `runs tree` print (issue 17, item 4).

A chat of runs continuing each other, a second tab (stored as a fork of the same snapshot), a fork
into another conversation and a run whose origin was deleted, in a store of every kind the
command line opens by URL, through the console script.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, UserPromptPart
from rich.console import Console
from test_cli_inspect import store_url

from step_persistence import (
    ContinuableSnapshot,
    InMemoryStepStore,
    RunRecord,
    StepEvent,
    StepStore,
    ToolEffectRecord,
    from_spec,
)
from step_persistence.cli.lineage import load_conversation
from step_persistence.cli.render import conversation_tree
from step_persistence.records import OriginKind, RunOrigin
from support.backends import BACKENDS, spec_of
from support.console_script import cli

pytestmark = pytest.mark.anyio

START = datetime(2026, 1, 1, tzinfo=UTC)
CHAT = 'chat-6f1c2a'
WHAT_IF = 'what-if'


async def add_run(
    store: StepStore,
    run_id: str,
    minute: int,
    *,
    conversation: str | None,
    origin: tuple[OriginKind, str, int] | None = None,
    agent: str = 'chat',
    crashed: bool = False,
) -> None:
    """A run with two snapshots (seq 1 and 2) that completed, or crashed with a charge unresolved."""
    started = START + timedelta(minutes=minute)
    await store.register_run(
        RunRecord(
            run_id=run_id,
            conversation_id=conversation,
            agent_name=agent,
            started_at=started,
            origin=None if origin is None else RunOrigin(kind=origin[0], run_id=origin[1], seq=origin[2]),
        )
    )
    await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=started))
    for step in (1, 2):
        prompt = ModelRequest(parts=[UserPromptPart(f'{run_id}, step {step}')])
        await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=step, messages=[prompt]))
    if crashed:
        await store.record_tool_effect(
            ToolEffectRecord(run_id=run_id, tool_call_id='call-9', tool_name='charge_card', status='started')
        )
        return
    await store.append_event(
        StepEvent(run_id=run_id, kind='run_completed', step_index=3, timestamp=started + timedelta(seconds=5))
    )


async def a_chat(store: StepStore) -> None:
    """turn-1 <- turn-2 <- turn-3 (crashed); tab-2 continues turn-2's #2 too (a fork), tab-2b continues it;
    retry forks turn-2 #1; what-if-1 forks turn-2 #1 into another conversation; orphan continued a run
    deleted since; a run of another agent in a conversation of its own; one in none."""
    await add_run(store, 'turn-1', 0, conversation=CHAT)
    await add_run(store, 'turn-2', 1, conversation=CHAT, origin=('continued', 'turn-1', 2))
    await add_run(store, 'turn-3', 2, conversation=CHAT, origin=('continued', 'turn-2', 2), crashed=True)
    await add_run(store, 'tab-2', 3, conversation=CHAT, origin=('continued', 'turn-2', 2))
    await add_run(store, 'tab-2b', 4, conversation=CHAT, origin=('continued', 'tab-2', 2))
    await add_run(store, 'retry', 5, conversation=CHAT, origin=('forked', 'turn-2', 1))
    await add_run(store, 'what-if-1', 6, conversation=WHAT_IF, origin=('forked', 'turn-2', 1))
    await add_run(store, 'what-if-2', 7, conversation=WHAT_IF, origin=('continued', 'what-if-1', 2))
    await add_run(store, 'doomed', 8, conversation='scratch')
    await add_run(store, 'orphan', 9, conversation=CHAT, origin=('continued', 'doomed', 2))
    await store.delete_run(run_id='doomed')
    await add_run(store, 'report-1', 10, conversation='reports', agent='reporter')
    await add_run(store, 'loner', 11, conversation=None)


@pytest.fixture(params=['file', 'sqlite', 'postgres', 'mongo'])
async def chat_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """`a_chat` in a durable store of each kind the command line opens by URL."""
    async with BACKENDS[request.param].open(request) as session:
        async with from_spec(**spec_of(session)) as store:
            await a_chat(store)
        yield store_url(spec_of(session))


def as_json(*args: str) -> Any:
    return json.loads(cli(*args, '--json').stdout)


async def test_conversations_are_listed_by_their_newest_run(chat_url: str) -> None:
    listed = as_json('conversations', 'list', '--store', chat_url)
    assert [c['conversation_id'] for c in listed] == ['reports', CHAT, WHAT_IF]
    chat = listed[1]
    assert (chat['run_count'], chat['head_run_id']) == (7, 'orphan')
    assert (chat['first_started_at'], chat['last_started_at']) == ('2026-01-01T00:00:00Z', '2026-01-01T00:09:00Z')

    oldest = as_json('conversations', 'list', '--store', chat_url, '--oldest-first', '--limit', '2')
    assert [c['conversation_id'] for c in oldest] == [WHAT_IF, CHAT]
    assert [c['conversation_id'] for c in as_json('conversations', 'list', '--store', chat_url, '--limit', '0')] == [
        'reports',
        CHAT,
        WHAT_IF,
    ]
    by_agent = as_json('conversations', 'list', '--store', chat_url, '--agent', 'reporter')
    assert [(c['conversation_id'], c['run_count']) for c in by_agent] == [('reports', 1)]

    shown = cli('conversations', 'list', '--store', chat_url, '--limit', '1')
    assert 'reports' in shown.stdout and CHAT not in shown.stdout
    assert 'showing the newest 1 conversations (by their last run)' in shown.stderr
    table = cli('conversations', 'list', '--store', chat_url).stdout
    assert any(CHAT in line and 'orphan' in line and ' 7 ' in line for line in table.splitlines()), table
    assert cli('conversations', 'list', '--store', chat_url).stderr == ''
    assert 'No conversation matches.' in cli('conversations', 'list', '--store', chat_url, '--agent', 'x').stdout
    assert '--limit' in cli('conversations', 'list', '--store', chat_url, '--limit', '-1', expect=2).stderr


async def test_an_empty_store_has_no_conversations(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "empty.db"}'
    cli('db', 'upgrade', '--store', url)  # an empty store (one that does not exist is refused: exit 4)
    assert cli('conversations', 'list', '--store', url).stdout.strip() == 'No conversations.'
    assert as_json('conversations', 'list', '--store', url) == []


async def test_a_conversation_is_shown_as_a_tree_of_continuations_and_forks(chat_url: str) -> None:
    shown = as_json('conversations', 'show', CHAT, '--store', chat_url)
    assert shown['conversation_id'] == CHAT
    runs = {run['record']['run_id']: run for run in shown['runs']}
    assert list(runs) == ['turn-1', 'turn-2', 'turn-3', 'tab-2', 'tab-2b', 'retry', 'orphan'], 'oldest first'
    assert runs['turn-2']['children'] == ['turn-3', 'tab-2', 'retry']
    assert runs['tab-2']['record']['origin'] == {'kind': 'forked', 'run_id': 'turn-2', 'seq': 2}, 'the second tab'
    assert runs['tab-2']['children'] == ['tab-2b']
    assert runs['turn-2']['origin_outside'] is None and runs['turn-1']['record']['origin'] is None
    assert runs['orphan']['origin_outside'] == 'not_stored'
    assert {run_id: run['status'] for run_id, run in runs.items()} == {
        'turn-1': 'completed',
        'turn-2': 'completed',
        'turn-3': 'crashed',
        'tab-2': 'completed',
        'tab-2b': 'completed',
        'retry': 'completed',
        'orphan': 'completed',
    }
    assert [effect['tool_call_id'] for effect in runs['turn-3']['unresolved']] == ['call-9']

    text = cli('conversations', 'show', CHAT, '--store', chat_url).stdout
    assert text.splitlines() == [
        f'Conversation {CHAT}  (7 runs)',
        '├── chat  turn-1  completed  2026-01-01 00:00:00Z',
        '├── chat  turn-2  completed  2026-01-01 00:01:00Z  continued from #2',
        '│   ├── forked from #2',
        '│   │   ├── chat  tab-2  completed  2026-01-01 00:03:00Z',
        '│   │   └── chat  tab-2b  completed  2026-01-01 00:04:00Z  continued from #2',
        '│   └── forked from #1',
        '│       └── chat  retry  completed  2026-01-01 00:05:00Z',
        '├── chat  turn-3  crashed  2026-01-01 00:02:00Z  continued from #2',
        '│   ! unresolved charge_card (call-9)',
        '└── chat  orphan  completed  2026-01-01 00:09:00Z  continued from doomed #2 (no longer stored)',
    ], text


async def test_a_fork_into_another_conversation_starts_at_its_top_level(chat_url: str) -> None:
    shown = as_json('conversations', 'show', 'what', '--store', chat_url)
    assert shown['conversation_id'] == WHAT_IF, 'a unique prefix names the conversation'
    first, second = shown['runs']
    assert (first['origin_outside'], first['children'], second['origin_outside']) == (
        'other_conversation',
        ['what-if-2'],
        None,
    )
    text = cli('conversations', 'show', WHAT_IF, '--store', chat_url).stdout
    assert 'what-if-1  completed  2026-01-01 00:06:00Z  forked from turn-2 #1 (in another conversation)' in text


async def test_a_missing_or_ambiguous_conversation(chat_url: str) -> None:
    missing = cli('conversations', 'show', 'nope', '--store', chat_url, expect=3)
    assert "conversation 'nope' does not exist" in missing.stderr
    cli('conversations', 'show', 'scratch', '--store', chat_url, expect=3)  # its one run was deleted
    assert as_json('conversations', 'show', 'rep', '--store', chat_url)['conversation_id'] == 'reports'
    async with from_spec(chat_url) as store:
        await add_run(store, 'reply', 12, conversation='replies')
    ambiguous = cli('conversations', 'show', 're', '--store', chat_url, expect=2)
    assert 'ambiguous' in ambiguous.stderr and 'reports' in ambiguous.stderr and 'replies' in ambiguous.stderr


async def test_runs_show_and_tree_print_the_origin_and_what_went_on_from_it(chat_url: str) -> None:
    shown = as_json('runs', 'show', 'turn-2', '--store', chat_url)
    assert shown['run']['origin'] == {'kind': 'continued', 'run_id': 'turn-1', 'seq': 2}
    assert shown['continuations'] == [
        {'run_id': 'turn-3', 'kind': 'continued', 'seq': 2},
        {'run_id': 'tab-2', 'kind': 'forked', 'seq': 2},
        {'run_id': 'retry', 'kind': 'forked', 'seq': 1},
        {'run_id': 'what-if-1', 'kind': 'forked', 'seq': 1},
    ]
    text = cli('runs', 'show', 'turn-2', '--store', chat_url).stdout.splitlines()
    assert text[:6] == [
        'Run turn-2',
        'continued from turn-1 #2',
        'continued by turn-3 (from #2)',
        'forked by tab-2 (from #2)',
        'forked by retry (from #1)',
        'forked by what-if-1 (from #1)',
    ], text
    assert as_json('runs', 'show', 'turn-1', '--store', chat_url)['run']['origin'] is None
    assert cli('runs', 'show', 'loner', '--store', chat_url).stdout.splitlines()[1].split()[:2] == ['run', 'status'], (
        'no lineage lines for a run without origin or continuations'
    )

    tree = as_json('runs', 'tree', 'tab-2', '--store', chat_url)
    assert tree['record']['origin'] == {'kind': 'forked', 'run_id': 'turn-2', 'seq': 2}
    assert tree['continuations'] == [{'run_id': 'tab-2b', 'kind': 'continued', 'seq': 2}]
    assert cli('runs', 'tree', 'tab-2', '--store', chat_url).stdout.splitlines() == [
        'chat  tab-2  completed  forked from turn-2 #2',
        'continued by tab-2b (from #2)',
    ]


async def test_runs_tree_prints_the_lineage_of_every_delegated_run(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "runs.db"}'
    async with from_spec(url) as store:
        await add_run(store, 'boss', 0, conversation='work')
        await store.register_run(RunRecord(run_id='helper', parent_run_id='boss', agent_name='helper'))
        await add_run(store, 'boss-2', 1, conversation='work', origin=('continued', 'boss', 1))
        await store.register_run(
            RunRecord(
                run_id='helper-2',
                parent_run_id='boss',
                agent_name='helper',
                origin=RunOrigin(kind='forked', run_id='boss-2', seq=2),
            )
        )
    tree = as_json('runs', 'tree', 'boss', '--store', url)
    assert tree['continuations'] == [{'run_id': 'boss-2', 'kind': 'continued', 'seq': 1}]
    assert [(child['record']['run_id'], child['continuations']) for child in tree['children']] == [
        ('helper', []),
        ('helper-2', []),
    ]
    assert tree['children'][1]['record']['origin'] == {'kind': 'forked', 'run_id': 'boss-2', 'seq': 2}
    text = cli('runs', 'tree', 'boss', '--store', url).stdout
    assert 'continued by boss-2 (from #1)' in text and 'helper-2  running  forked from boss-2 #2' in text, text


async def test_origins_that_loop_are_cut_at_the_oldest_run() -> None:
    """Damaged origins (each run naming the other) still give a tree: the oldest run of the loop is a root."""
    store = InMemoryStepStore()
    await add_run(store, 'a', 0, conversation='loop', origin=('continued', 'b', 1))
    await add_run(store, 'b', 1, conversation='loop', origin=('continued', 'a', 1))
    await add_run(store, 'c', 2, conversation='loop', origin=('continued', 'c', 1))
    runs = await load_conversation(store, 'loop')
    assert [(run.record.run_id, run.origin_outside, run.children) for run in runs] == [
        ('a', 'cycle', ['b']),
        ('b', None, []),
        ('c', 'cycle', []),
    ]
    console = Console(width=200, record=True, color_system=None)
    console.print(conversation_tree('loop', runs))
    assert console.export_text().splitlines() == [
        'Conversation loop  (3 runs)',
        '├── chat  a  completed  2026-01-01 00:00:00Z  continued from b #1 (which descends from this run)',
        '├── chat  b  completed  2026-01-01 00:01:00Z  continued from #1',
        '└── chat  c  completed  2026-01-01 00:02:00Z  continued from c #1 (which descends from this run)',
    ]
    assert await load_conversation(store, 'nothing') == []

    await add_run(store, 'alone', 3, conversation='single')
    console.print(conversation_tree('single', await load_conversation(store, 'single')))
    assert 'Conversation single  (1 run)' in console.export_text()
