"""What pydantic-ai-harness wrote, read through `harness+...://` stores and copied to ours: every backend it has.

The data is the harness's own (tests/harness_data/, written by generate.py with pydantic-ai-harness
0.62 and, first, 0.58): its file store, its SQLite file, its PostgreSQL tables (the dump run into a
fresh database) and its MongoDB collections (the documents inserted into a fresh database).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy.exc import DBAPIError

from harness_data.checks import (
    RawCounts,
    check_scenario,
    file_counts,
    place_file_store,
    place_mongo,
    place_postgres,
    place_sqlite,
    sqlite_counts,
    tree_digest,
)
from harness_data.payloads import CRASHED_RUN
from step_persistence import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, copy_runs, from_spec
from step_persistence.stores.harness import ReadOnlyStoreError
from support.console_script import cli
from support.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class HarnessData:
    """One backend's harness data, placed for one test."""

    url: str
    counts: RawCounts
    local: Path | None = None
    """The file or directory it lives in, when on this machine."""


@pytest.fixture(params=['file', 'sqlite', 'postgres', 'mongo'])
async def harness_data(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[HarnessData]:
    if request.param == 'file':
        directory = place_file_store(tmp_path / 'harness-runs')
        yield HarnessData(f'harness+file://{directory}', file_counts(directory), directory)
    elif request.param == 'sqlite':
        database = place_sqlite(tmp_path / 'old.db')
        yield HarnessData(f'harness+sqlite:///{database}', sqlite_counts(database), database)
    elif request.param == 'postgres':
        server = request.getfixturevalue('postgres_server')
        name = await server.create_database()
        try:
            counts = await place_postgres(server.port, name)
            yield HarnessData(f'harness+postgresql://postgres@127.0.0.1:{server.port}/{name}', counts)
        finally:
            await server.drop_database(name)
    else:
        server = request.getfixturevalue('mongo_server')
        async with server.scratch() as scratch:
            name = scratch.fresh_database()
            counts = place_mongo(server.uri, name)
            yield HarnessData('harness+' + server.uri_for(name), counts)


async def test_every_run_reads_back_whole(harness_data: HarnessData) -> None:
    """Runs, lineage, events, effects with their annotations, both snapshot states and every media payload,
    as the harness stored them; reading writes nothing."""
    before = None if harness_data.local is None else tree_digest(harness_data.local)
    async with from_spec(harness_data.url) as store:
        await check_scenario(store, harness_data.counts)
        assert [run.run_id for run in await store.list_runs(limit=1, newest_first=True)] == [CRASHED_RUN]
        conversations = {summary.conversation_id: summary.run_count for summary in await store.list_conversations()}
        assert conversations['orch-conv'] == 2
    if harness_data.local is not None:
        assert tree_digest(harness_data.local) == before


async def test_copy_moves_everything_and_again_nothing(harness_data: HarnessData, tmp_path: Path) -> None:
    """`step-persistence copy harness+...:// sqlite:///runs.db`: every run arrives whole; again, all are skipped."""
    destination = f'sqlite:///{tmp_path / "runs.db"}'
    first = cli('copy', harness_data.url, destination)
    assert f'{harness_data.counts.runs} run(s) copied, 0 already at the destination, 0 failed' in first.stdout
    second = cli('copy', harness_data.url, destination)
    assert f'0 run(s) copied, {harness_data.counts.runs} already at the destination, 0 failed' in second.stdout
    async with from_spec(destination) as ours, from_spec(harness_data.url) as harness:
        await check_scenario(ours, harness_data.counts)
        for run in await harness.list_runs():
            theirs = await harness.list_snapshots(run_id=run.run_id, include_interrupted=True)
            copied = await ours.list_snapshots(run_id=run.run_id, include_interrupted=True)
            assert [snapshot.messages for snapshot in copied] == [snapshot.messages for snapshot in theirs]


async def test_writes_are_refused(harness_data: HarnessData) -> None:
    async with from_spec(harness_data.url) as store:
        run_id = CRASHED_RUN
        writes = [
            store.register_run(RunRecord(run_id='new')),
            store.append_event(StepEvent(run_id=run_id, kind='run_completed', step_index=2)),
            store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=2, messages=[])),
            store.record_tool_effect(
                ToolEffectRecord(run_id=run_id, tool_call_id='deploy-1', tool_name='deploy', status='completed')
            ),
            store.delete_run(run_id=run_id),
        ]
        for write in writes:
            with pytest.raises(ReadOnlyStoreError, match='written by pydantic-ai-harness and is only read here'):
                await write
        assert len(await store.list_unresolved_tool_effects(run_id=run_id)) == 1


async def test_copying_into_a_harness_store_fails_each_run_clearly(tmp_path: Path) -> None:
    database = place_sqlite(tmp_path / 'old.db')
    before = tree_digest(database)
    async with from_spec('memory') as source:
        await source.register_run(RunRecord(run_id='ours-1'))
        async with from_spec(f'harness+sqlite:///{database}') as destination:
            report = await copy_runs(source, destination)
    assert list(report.failed) == ['ours-1']
    assert 'only read here' in report.failed['ours-1']
    assert tree_digest(database) == before


@pytest.mark.parametrize(
    ('url', 'message'),
    [
        ('harness+redis://localhost/0', 'unsupported harness store URL'),
        ('harness+sqlite://', 'names its file'),
        ('harness+sqlite:///old.db?table=x', r'\?table= applies to harness\+postgresql:// stores only'),
        ('harness+file://', 'names no directory'),
    ],
)
def test_urls_that_name_no_harness_store(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_spec(url)


def test_a_missing_location_is_refused_before_reading(tmp_path: Path) -> None:
    """Reading never creates: a harness SQLite file or directory that does not exist is an unreachable store (4)."""
    for url in (f'harness+sqlite:///{tmp_path / "missing.db"}', f'harness+file://{tmp_path / "missing"}'):
        completed = cli('runs', 'list', '--store', url, expect=4)
        assert 'does not exist' in completed.stderr
    assert list(tmp_path.iterdir()) == []


async def test_the_media_table_can_be_named(tmp_path: Path) -> None:
    """`?media_table=`: a harness SQLite store whose media store had a table of its own."""
    database = place_sqlite(tmp_path / 'old.db')
    connection = sqlite3.connect(database)
    connection.execute('ALTER TABLE media RENAME TO blobs')
    connection.commit()
    connection.close()
    async with from_spec(f'harness+sqlite:///{database}?media_table=blobs') as store:
        await check_scenario(store, sqlite_counts(database))


async def test_a_postgres_table_name_is_quoted(postgres_server: PostgresServer) -> None:
    """`?table=` is an identifier, never SQL: a hostile one names tables that do not exist, and drops nothing."""
    name = await postgres_server.create_database()
    try:
        await place_postgres(postgres_server.port, name)
        url = f'harness+postgresql://postgres@127.0.0.1:{postgres_server.port}/{name}'
        hostile = quote('x_runs; DROP TABLE step_persistence_runs; --')
        async with from_spec(f'{url}?table={hostile}') as store:
            with pytest.raises(DBAPIError, match='does not exist'):
                await store.list_runs()
        async with from_spec(url) as store:
            assert len(await store.list_runs()) == 8
    finally:
        await postgres_server.drop_database(name)
