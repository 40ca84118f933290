"""`runs list` and every command that names a run (issue 18, item 4).

Newest first with a limit; run ids whole on one line at an 80-column terminal and in a pipe; a run
named by a unique prefix of its id; statuses computed once per run shown, or in one query on SQL.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import termios
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, UserPromptPart

from step_persistence import (
    ContinuableSnapshot,
    InMemoryStepStore,
    RunRecord,
    StepEvent,
    StepStore,
    ToolEffectRecord,
    from_spec,
)
from step_persistence.cli._common import UsageError, resolve_run_id
from step_persistence.cli.listing import BATCH, candidate_runs, select_summaries, summaries_in_one_query
from step_persistence.reporting import summarize_runs
from support.console_script import cli

pytestmark = pytest.mark.anyio

START = datetime(2026, 1, 1, tzinfo=UTC)
LONG_ID = 'code_librarian.-01a233a1-8640-7266-9d5c-0d2b8862df93'
LONGER_ID = 'an_orchestrator_with_a_long_name.-01a233a1-8640-7266-9d5c-0d2b8862df93-retry-2'


async def add_run(
    store: StepStore, run_id: str, minute: int, *, ended: bool = True, unresolved: bool = False, **lineage: str
) -> None:
    started = START + timedelta(minutes=minute)
    await store.register_run(RunRecord(run_id=run_id, agent_name='agent', started_at=started, **lineage))
    await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=started))
    if unresolved:
        effect = ToolEffectRecord(
            run_id=run_id, tool_call_id='call-1', tool_name='charge_card', status='started', started_at=started
        )
        await store.record_tool_effect(effect)
        await store.append_event(
            StepEvent(
                run_id=run_id,
                kind='tool_call_started',
                step_index=1,
                tool_call_id='call-1',
                tool_name='charge_card',
                timestamp=started,
            )
        )
    if ended:
        await store.append_event(
            StepEvent(run_id=run_id, kind='run_completed', step_index=2, timestamp=started + timedelta(seconds=3))
        )


@pytest.fixture(params=['file', 'sqlite'])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A file store (summaries through the protocol) or a SQLite one (the run_summary view)."""
    return f'file://{tmp_path / "runs"}' if request.param == 'file' else f'sqlite:///{tmp_path / "runs.db"}'


def listed(url: str, *args: str) -> list[str]:
    return [run['run_id'] for run in json.loads(cli('runs', 'list', '--store', url, '--json', *args).stdout)]


async def test_newest_first_with_a_limit(store_url: str) -> None:
    async with from_spec(store_url) as store:
        for minute in range(60):
            await add_run(store, f'run-{minute:02d}', minute, ended=minute % 10 != 3, unresolved=minute % 10 == 3)
    newest = [f'run-{minute:02d}' for minute in reversed(range(60))]

    assert listed(store_url) == newest[:50]
    assert listed(store_url, '--limit', '5') == newest[:5]
    assert listed(store_url, '--limit', '0') == newest
    assert listed(store_url, '--oldest-first', '--limit', '3') == ['run-00', 'run-01', 'run-02']
    assert listed(store_url, '--newest-first', '--limit', '1') == ['run-59']
    assert listed(store_url, '--status', 'crashed', '--limit', '2') == ['run-53', 'run-43']

    since = (START + timedelta(minutes=30)).isoformat()
    assert listed(store_url, '--since', since, '--limit', '2') == ['run-59', 'run-58']
    assert listed(store_url, '--since', since, '--oldest-first', '--limit', '2') == ['run-30', 'run-31']
    assert listed(store_url, '--since', since, '--limit', '0') == newest[:30]
    assert listed(store_url, '--agent', 'agent', '--limit', '3') == newest[:3]
    assert listed(store_url, '--agent', 'someone else') == []

    shown = cli('runs', 'list', '--store', store_url, '--limit', '10')
    assert 'showing the newest 10 matching runs' in shown.stderr
    assert cli('runs', 'list', '--store', store_url, '--since', since, '--limit', '30').stderr == '', (
        'exactly 30 runs started since: no more to show'
    )
    assert (
        'showing the oldest 29'
        in cli('runs', 'list', '--store', store_url, '--since', since, '--limit', '29', '--oldest-first').stderr
    )
    assert cli('runs', 'list', '--store', store_url, '--limit', '0').stderr == ''
    assert '--limit' in cli('runs', 'list', '--store', store_url, '--limit', '-1', expect=2).stderr


def on_a_terminal(*args: str, columns: int = 80) -> str:
    """What the console script writes on stdout when stdout is a terminal `columns` wide (colours removed)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack('HHHH', 40, columns, 0, 0))
    environment = {key: value for key, value in os.environ.items() if key not in ('COLUMNS', 'LINES')}
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal has no writer left
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        terminal = {**environment, 'TERM': 'xterm', 'NO_COLOR': '1'}
        cli(*args, env=terminal, stdout=os.ttyname(follower), stderr=os.devnull)
    finally:
        os.close(follower)
        reader.join(timeout=30)
        os.close(leader)
    shown = b''.join(chunks).decode(errors='replace').replace('\r\n', '\n')
    return re.sub(r'\x1b\[[0-9;?]*[A-Za-z]', '', shown)


def whole_on_one_line(output: str, *run_ids: str) -> None:
    for run_id in run_ids:
        assert any(run_id in line for line in output.splitlines()), (run_id, output)


async def test_run_ids_are_never_wrapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f'sqlite:///{tmp_path / "runs.db"}'
    async with from_spec(url) as store:
        await add_run(store, LONGER_ID, 0, ended=False)
        await add_run(store, LONG_ID, 1, unresolved=True, ended=False, parent_run_id=LONGER_ID)
    inspections = {
        ('runs', 'list'): (LONG_ID, LONGER_ID),
        ('runs', 'unresolved'): (LONG_ID,),
        ('runs', 'tree', LONGER_ID): (LONG_ID, LONGER_ID),
        ('runs', 'show', LONG_ID): (LONG_ID,),
        ('report',): (LONG_ID, LONGER_ID),
    }

    whole_on_one_line(on_a_terminal('runs', 'tree', LONGER_ID, '--store', url), LONG_ID, LONGER_ID)
    shown = on_a_terminal('runs', 'show', LONG_ID, '--store', url)
    assert any(LONG_ID in line and 'crashed' in line for line in shown.splitlines()), shown
    listing = on_a_terminal('runs', 'list', '--store', url)
    whole_on_one_line(listing, LONG_ID, LONGER_ID)
    assert 'status' in listing and 'crashed' in listing, listing
    assert 'not shown at this width' in listing
    wide = on_a_terminal('runs', 'list', '--store', url, columns=100)
    assert all(len(line) <= 100 for line in wide.splitlines()) and 'not shown at this width' in wide

    monkeypatch.setenv('COLUMNS', '80')
    for words, run_ids in inspections.items():
        whole_on_one_line(cli(*words, '--store', url).stdout, *run_ids)
    piped = cli('runs', 'list', '--store', url).stdout
    assert 'unresolved' in piped and 'not shown' not in piped, 'a pipe gets every column, on one line per run'


async def test_a_unique_prefix_names_a_run_in_every_command(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "runs.db"}'
    target = f'file://{tmp_path / "copy"}'
    async with from_spec(url) as store:
        await add_run(store, 'alpha-1', 0, unresolved=True, ended=False)
        await add_run(store, 'alpha-10', 1, parent_run_id='alpha-1')
        await add_run(store, 'beta', 2)
        prompt = ModelRequest(parts=[UserPromptPart('hello')])
        await store.save_snapshot(ContinuableSnapshot(run_id='beta', step_index=1, messages=[prompt]))

    assert json.loads(cli('runs', 'show', 'bet', '--store', url, '--json').stdout)['run']['run_id'] == 'beta'
    assert json.loads(cli('runs', 'show', 'alpha-1', '--store', url, '--json').stdout)['run']['run_id'] == 'alpha-1', (
        'an exact id wins over the longer ids it is a prefix of'
    )
    ambiguous = cli('runs', 'show', 'alp', '--store', url, expect=2)
    assert 'ambiguous' in ambiguous.stderr and 'alpha-1,' in ambiguous.stderr and 'alpha-10' in ambiguous.stderr
    assert 'zzz' in cli('runs', 'show', 'zzz', '--store', url, expect=3).stderr

    assert json.loads(cli('runs', 'tree', 'alpha-1', '--store', url, '--json').stdout)['children'][0]['record'][
        'run_id'
    ] == ('alpha-10')
    assert json.loads(cli('runs', 'messages', 'be', '--store', url, '--json').stdout)['run_id'] == 'beta'
    assert listed(url, '--parent', 'alpha-1') == ['alpha-10']
    assert listed(url, '--parent', 'gone-run') == [], 'a parent no longer stored is taken as it is'
    cli('runs', 'tree', 'alp', '--store', url, expect=2)

    resolution = ('--status', 'failed', '--summary', 'no charge', '--store', url)
    resolved = cli('runs', 'resolve', 'alpha-1', 'call-1', *resolution)
    assert 'resolved' in resolved.stdout
    copied = json.loads(cli('copy', url, target, '--run', 'bet', '--json').stdout)
    assert copied['copied'] == ['beta']
    cli('copy', url, target, '--run', 'alp', expect=2)

    assert json.loads(cli('runs', 'delete', 'alpha-10', '--store', url, '--json').stdout) == {'deleted': ['alpha-10']}
    assert json.loads(cli('runs', 'delete', 'alp', '--store', url, '--json').stdout) == {'deleted': ['alpha-1']}
    assert listed(url) == ['beta']


class CountingStore(InMemoryStepStore):
    """Counts the runs whose events a reader asked for, and records how runs were listed."""

    def __init__(self) -> None:
        super().__init__()
        self.events_read: list[str] = []
        self.listings: list[dict[str, object]] = []

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        self.events_read.append(run_id)
        return await super().list_events(run_id=run_id)

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        self.listings.append(filters)
        return await super().list_runs(**filters)


async def test_a_run_id_prefix_reads_only_the_runs_it_starts() -> None:
    store = CountingStore()
    for minute in range(100):
        await add_run(store, f'run-{minute:03d}', minute)
    returned: list[str] = []
    listing = store.list_runs

    async def counted(**filters: Any) -> list[RunRecord]:
        records = await listing(**filters)
        returned.extend(record.run_id for record in records)
        return records

    store.list_runs = counted  # type: ignore[method-assign]
    assert await resolve_run_id(store, 'run-099') == 'run-099' and returned == [], 'an exact id is one read'
    with pytest.raises(UsageError, match='10 run ids start with it'):
        await resolve_run_id(store, 'run-05')
    assert returned == [f'run-05{n}' for n in range(10)], 'the store lists only the runs the prefix starts'


async def test_the_store_filters_orders_and_limits_the_runs_listed() -> None:
    store = CountingStore()
    for minute in range(100):
        await add_run(store, f'run-{minute:03d}', minute, conversation_id=f'chat-{minute % 2}')
    since = START + timedelta(minutes=97)

    newest = await candidate_runs(store, conversation_id='chat-1', agent_name='agent', wanted=3)
    assert [record.run_id for record in newest] == ['run-099', 'run-097', 'run-095']
    recent = await candidate_runs(store, since=since, wanted=5)
    assert [record.run_id for record in recent] == ['run-099', 'run-098', 'run-097']
    oldest_recent = await candidate_runs(store, since=since, newest_first=False, wanted=2)
    assert [record.run_id for record in oldest_recent] == ['run-097', 'run-098', 'run-099']
    assert len(await candidate_runs(store)) == 100
    assert [(listing['limit'], listing['newest_first']) for listing in store.listings] == [
        (3, True),
        (5, True),
        (None, False),
        (None, True),
    ], 'limited by the store unless an oldest-first --since needs every run'
    assert store.listings[0]['conversation_id'] == 'chat-1' and store.listings[0]['agent_name'] == 'agent'


async def test_only_the_runs_shown_are_summarised() -> None:
    store = CountingStore()
    for minute in range(100):
        await add_run(store, f'run-{minute:03d}', minute, ended=minute != 98, unresolved=minute == 98)
    newest = list(reversed(await store.list_runs()))

    summaries, more = await select_summaries(store, newest, status=None, limit=5)
    assert [s.run_id for s in summaries] == ['run-099', 'run-098', 'run-097', 'run-096', 'run-095'] and more
    assert len(store.events_read) <= BATCH, 'summarised a batch, not every run'

    store.events_read.clear()
    crashed, more = await select_summaries(store, newest, status='crashed', limit=1)
    assert [s.run_id for s in crashed] == ['run-098'] and not more
    everything, more = await select_summaries(store, newest, status=None, limit=None)
    assert len(everything) == 100 and not more


async def test_a_sql_store_summarises_every_run_in_one_query(tmp_path: Path) -> None:
    async with from_spec(f'sqlite:///{tmp_path / "runs.db"}') as store:
        for minute in range(5):
            await add_run(store, f'run-{minute}', minute, ended=minute != 2, unresolved=minute == 2)
        in_one_query = await summaries_in_one_query(store)
        assert in_one_query is not None
        protocol = await summarize_runs(store)
    assert [in_one_query[s.run_id].status for s in protocol] == [s.status for s in protocol]
    assert {s.run_id: s.unresolved_effects for s in protocol} == {
        run_id: s.unresolved_effects for run_id, s in in_one_query.items()
    }
    assert await summaries_in_one_query(InMemoryStepStore()) is None
