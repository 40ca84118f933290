"""`step-persistence copy SRC DST` and `copy_runs`: every run, whole, between stores of every kind.

Real agent runs (a delegation tree, a failing run with a retry and frontier snapshots, a run that
crashed mid-tool in another process, hand-written stale/idle runs, and a run whose tool returned
an image above the media threshold) are written to a file store, then copied by the console
script file -> SQLite -> PostgreSQL -> MongoDB; all four stores must then hold the same runs,
events, tool effects and snapshots (messages byte for byte).
"""

from __future__ import annotations

import base64
import json
import os
import pty
import random
import sqlite3
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessagesTypeAdapter

from step_persistence import (
    ContinuableSnapshot,
    InMemoryStepStore,
    RunRecord,
    StepEvent,
    StepPersistence,
    StepStore,
    ToolEffectRecord,
    copy_runs,
    from_spec,
)
from step_persistence.stores.sql.schema import media
from support.backends import _count_rows
from support.console_script import cli
from support.databases import EmptyDatabase
from support.reporting_runs import populate
from support.scripted import calls, scripted, text
from support.servers.mongo import MongoServer

pytestmark = pytest.mark.anyio

IMAGE = random.Random(7).randbytes(300 * 1024)
"""Above the 64 KiB media threshold: stored as a media blob by every durable store."""
MEDIA_RUN = 'camera-run'


async def _media_run(store: StepStore) -> None:
    agent = Agent(
        scripted(calls(('snap', {'n': 1}, 'snap-1')), text('a picture')),
        capabilities=[StepPersistence(store=store, agent_name='camera', run_id=MEDIA_RUN)],
    )

    @agent.tool_plain
    def snap(n: int) -> BinaryContent:
        return BinaryContent(data=IMAGE, media_type='image/png')

    await agent.run('take a picture')


async def write_runs(directory: Path) -> None:
    """The runs of `support/reporting_runs.py` and the media run, in a file store at `directory`."""
    spec = {'backend': 'file', 'directory': str(directory)}
    await populate(spec)
    async with from_spec(**spec) as store:
        await _media_run(store)


async def contents(store: StepStore) -> dict[str, Any]:
    """Everything the store holds, as JSON, in order; snapshots without their store-assigned `seq`."""
    held: dict[str, Any] = {}
    for record in await store.list_runs():
        snapshots = await store.list_snapshots(run_id=record.run_id, include_interrupted=True)
        held[record.run_id] = {
            'record': record.model_dump(mode='json'),
            'events': [event.model_dump(mode='json') for event in await store.list_events(run_id=record.run_id)],
            'effects': [
                effect.model_dump(mode='json') for effect in await store.list_tool_effects(run_id=record.run_id)
            ],
            'snapshots': [snapshot.model_dump(mode='json', exclude={'seq', 'messages'}) for snapshot in snapshots],
            'messages': [ModelMessagesTypeAdapter.dump_json(snapshot.messages) for snapshot in snapshots],
        }
    return held


async def read(url: str) -> dict[str, Any]:
    async with from_spec(url) as store:
        return await contents(store)


def copy(source: str, destination: str, *args: str, expect: int = 0) -> Any:
    return json.loads(cli('copy', source, destination, *args, '--json', expect=expect).stdout)


@pytest.fixture
async def urls(
    tmp_path: Path, postgres_database: EmptyDatabase, mongo_server: MongoServer
) -> AsyncIterator[dict[str, str]]:
    """Store URLs of each kind, all empty (the PostgreSQL and MongoDB databases are dropped afterwards)."""
    async with mongo_server.scratch() as scratch:
        yield {
            'file': f'file://{tmp_path / "A"}',
            'sqlite': f'sqlite:///{tmp_path / "B.db"}',
            'postgres': postgres_database.url.replace('+asyncpg', ''),
            'mongo': mongo_server.uri_for(scratch.fresh_database()),
        }


async def test_copy_file_to_sqlite_to_postgres_to_mongo(
    tmp_path: Path, urls: dict[str, str], postgres_database: EmptyDatabase, mongo_server: MongoServer
) -> None:
    await write_runs(tmp_path / 'A')
    original = await read(urls['file'])
    run_ids = list(original)
    assert {'orchestrator-run', MEDIA_RUN, 'stale-run', 'idle-run'} <= set(run_ids) and len(run_ids) == 9
    effects = [effect['status'] for run in original.values() for effect in run['effects']]
    assert {'started', 'completed', 'failed'} <= set(effects)
    assert any(snapshot['state'] == 'interrupted' for run in original.values() for snapshot in run['snapshots'])
    assert any(run['record']['parent_run_id'] for run in original.values())
    assert base64.urlsafe_b64encode(IMAGE) in original[MEDIA_RUN]['messages'][-1], 'the image, restored'

    chain = ['file', 'sqlite', 'postgres', 'mongo']
    for source, destination in pairwise(chain):
        report = copy(urls[source], urls[destination])
        assert report == {'copied': run_ids, 'skipped': [], 'failed': {}, 'repaired': []}, (source, destination)

    for kind in chain[1:]:
        assert await read(urls[kind]) == original, f'the {kind} store holds exactly what the file store holds'

    # The image arrived as a media blob in every destination, not inline.
    with sqlite3.connect(tmp_path / 'B.db') as connection:
        assert connection.execute('select count(*) from media').fetchone()[0] >= 1
    assert await _count_rows([postgres_database.url], media) >= 1
    async with mongo_server.scratch() as scratch:
        database = urls['mongo'].rsplit('/', 1)[1].split('?', 1)[0]
        assert await scratch.client[database]['media'].count_documents({}) >= 1

    # Copying again copies nothing and changes nothing.
    for source, destination in pairwise(chain):
        again = copy(urls[source], urls[destination])
        assert again == {'copied': [], 'skipped': run_ids, 'failed': {}, 'repaired': []}
    for kind in chain[1:]:
        assert await read(urls[kind]) == original

    back = f'file://{tmp_path / "E"}'
    assert copy(urls['mongo'], back)['copied'] == run_ids
    assert await read(back) == original, 'and back from MongoDB to files'

    human = cli('copy', urls['file'], urls['sqlite']).stdout
    assert '0 run(s) copied' in human and f'{len(run_ids)} already at the destination' in human


async def test_an_interrupted_copy_is_repaired_by_copying_again(tmp_path: Path) -> None:
    await write_runs(tmp_path / 'A')
    source, destination = f'file://{tmp_path / "A"}', f'sqlite:///{tmp_path / "B.db"}'
    original = await read(source)
    partial = 'orchestrator-run'
    async with from_spec(source) as store, from_spec(destination) as copy_to:
        record = await store.get_run(run_id=partial)
        assert record is not None
        await copy_to.register_run(record)
        for event in (await store.list_events(run_id=partial))[:3]:
            await copy_to.append_event(event)
        snapshot = (await store.list_snapshots(run_id=partial))[0]
        await copy_to.save_snapshot(snapshot.model_copy(update={'seq': None}))

    report = copy(source, destination, '--run', partial, '--run', MEDIA_RUN)
    assert report == {'copied': [partial, MEDIA_RUN], 'skipped': [], 'failed': {}, 'repaired': [partial]}
    report = copy(source, destination)
    assert report['skipped'] == [partial, MEDIA_RUN] and not report['failed'] and not report['repaired']
    assert await read(destination) == original


async def test_a_conflicting_run_is_reported_and_left_alone(tmp_path: Path) -> None:
    source, destination = f'file://{tmp_path / "A"}', f'file://{tmp_path / "B"}'
    async with from_spec(source) as store, from_spec(destination) as other:
        for run_id in ('first', 'second', 'third'):
            await store.register_run(RunRecord(run_id=run_id, agent_name='writer'))
            await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
        await other.register_run(RunRecord(run_id='second', agent_name='somebody else'))
        third = await store.get_run(run_id='third')
        assert third is not None
        await other.register_run(third)
        await other.append_event(StepEvent(run_id='third', kind='run_failed', step_index=0))

    failed = cli('copy', source, destination, '--json', expect=1)
    report = json.loads(failed.stdout)
    assert report['copied'] == ['first'] and sorted(report['failed']) == ['second', 'third']
    assert 'different run' in report['failed']['second']
    assert 'source does not' in report['failed']['third']
    assert "run 'second' was not copied" in failed.stderr
    async with from_spec(destination) as other:
        second = await other.get_run(run_id='second')
        assert second is not None and second.agent_name == 'somebody else'
        assert [event.kind for event in await other.list_events(run_id='third')] == ['run_failed']


async def test_copy_runs_in_process_keeps_order_and_reports_each_run() -> None:
    source, destination = InMemoryStepStore(max_snapshots_per_run=2), InMemoryStepStore()
    await source.register_run(RunRecord(run_id='parent'))
    await source.register_run(RunRecord(run_id='child', parent_run_id='parent', metadata={'k': 'v'}))
    for step in range(4):
        await source.save_snapshot(ContinuableSnapshot(run_id='child', step_index=step, messages=[]))
    await source.record_tool_effect(
        ToolEffectRecord(run_id='child', tool_call_id='c1', tool_name='t', status='failed', effect_summary='no')
    )
    seen: list[tuple[str, str]] = []
    report = await copy_runs(source, destination, on_run=lambda result: seen.append((result.run_id, result.outcome)))
    assert seen == [('parent', 'copied'), ('child', 'copied')] and report.ok
    copied = await destination.list_snapshots(run_id='child')
    assert [(s.seq, s.step_index) for s in copied] == [(1, 2), (2, 3)], 'the destination numbers what the source kept'
    assert await destination.list_tool_effects(run_id='child') == await source.list_tool_effects(run_id='child')

    with pytest.raises(LookupError, match='nope'):
        await copy_runs(source, destination, run_ids=['nope'])
    pruning = InMemoryStepStore(max_snapshots_per_run=1)
    failed = await copy_runs(source, pruning)
    assert list(failed.failed) == ['child'] and 'prune' in failed.failed['child'] and failed.copied == ['parent']


def test_copy_errors(tmp_path: Path) -> None:
    store = f'file://{tmp_path / "A"}'
    (tmp_path / 'A').mkdir()  # an empty store (reading one that does not exist is refused: exit 4)
    bad = cli('copy', 'oracle://scott:tiger@db/x', store, expect=2)
    assert 'oracle' in bad.stderr and 'tiger' not in bad.stderr
    assert 'nope' in cli('copy', store, f'file://{tmp_path / "B"}', '--run', 'nope', expect=3).stderr
    unreachable = cli('copy', store, 'postgresql://nobody:secret@127.0.0.1:1/none', expect=4)
    assert 'cannot reach' in unreachable.stderr and 'secret' not in unreachable.stderr
    mongo = cli('copy', 'mongodb://127.0.0.1:1/none?serverSelectionTimeoutMS=300', store, '--json', expect=4)
    assert 'cannot reach' in mongo.stderr and mongo.stdout == ''


def _with_terminal_stderr(*args: str) -> tuple[str, str]:
    """Run the console script with stderr on a pseudo-terminal: (stdout, what the terminal showed)."""
    leader, follower = pty.openpty()
    try:
        environment = {**os.environ, 'TERM': 'xterm', 'COLUMNS': '120'}
        completed = cli(*args, env=environment, stderr=os.ttyname(follower))
        os.close(follower)
        shown = b''
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal has no writer left
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    return completed.stdout, shown.decode(errors='replace')


async def test_progress_bar_only_at_a_terminal_and_never_with_json(tmp_path: Path) -> None:
    source = f'file://{tmp_path / "A"}'
    async with from_spec(source) as store:
        for run_id in ('one', 'two'):
            await store.register_run(RunRecord(run_id=run_id))
    stdout, shown = _with_terminal_stderr('copy', source, f'file://{tmp_path / "B"}')
    assert '2 run(s) copied' in stdout
    assert 'copied runs' in shown and '2/2' in shown, shown
    stdout, shown = _with_terminal_stderr('copy', source, f'file://{tmp_path / "C"}', '--json')
    assert json.loads(stdout)['copied'] == ['one', 'two'] and shown == ''
    assert cli('copy', source, f'file://{tmp_path / "D"}').stderr == '', 'no bar when stderr is not a terminal'
