"""`collect_media` on SQLite while another OS process writes snapshots that reuse an old blob."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import timedelta
from functools import partial
from pathlib import Path

import anyio.to_thread
import pytest
from pydantic_ai.messages import BinaryContent, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart
from sqlalchemy import update
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqliteStepStore
from step_persistence.media import REUSE_WINDOW
from step_persistence.media.clock import media_now
from step_persistence.stores.sql.reclaiming import _DELETE_UNUSED
from step_persistence.stores.sql.schema import media
from step_persistence.testing.conformance import T0
from support.media_writer import RUN_ID, SCRIPT, history_for, payload

pytestmark = pytest.mark.anyio

STEPS = 15


async def _backdate_every_blob(database: Path, by: timedelta) -> None:
    """Make every stored blob look `by` older, through the media table itself (no sleeping)."""
    engine = create_async_engine(f'sqlite+aiosqlite:///{database}')
    try:
        async with engine.begin() as connection:
            await connection.execute(update(media).values(created_at=media_now() - by, touched_at=None))
    finally:
        await engine.dispose()


def _start_writer(spec: dict[str, object]) -> subprocess.Popen[str]:
    """Start `media_writer.py` and release it once it has imported."""
    writer = subprocess.Popen(
        [sys.executable, str(SCRIPT), json.dumps(spec), str(STEPS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdin is not None
    assert writer.stdout.readline().strip() == 'ready'
    writer.stdin.write('go\n')
    writer.stdin.flush()
    return writer


async def test_collect_media_while_another_process_reuses_an_old_blob(tmp_path: Path) -> None:
    database = tmp_path / 'runs.db'
    grace = REUSE_WINDOW + timedelta(minutes=5)
    async with SqliteStepStore(database, max_snapshots_per_run=3) as store:
        for run_id in ('old', RUN_ID):
            await store.register_run(RunRecord(run_id=run_id))
        only_old = BinaryContent(data=payload('only old'), media_type='image/png')
        old = [*history_for(1), ModelRequest(parts=[UserPromptPart(content=['old', only_old], timestamp=T0)])]
        await store.save_snapshot(ContinuableSnapshot(run_id='old', step_index=1, messages=old))
        await store.delete_run(run_id='old')  # its blobs (SHARED among them) are referenced by nothing
        await _backdate_every_blob(database, 2 * grace)

        spec = {'backend': 'sqlite', 'database': str(database), 'max_snapshots_per_run': 3}
        writer = _start_writer(spec)
        try:
            deleted, rounds = 0, 0
            while writer.poll() is None:
                deleted += (await store.collect_media(grace=grace)).blobs
                rounds += 1
            stdout, stderr = await anyio.to_thread.run_sync(partial(writer.communicate, timeout=120))
            assert writer.returncode == 0, stderr
            assert stdout.strip() == 'done'
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()

        assert rounds >= 1
        assert deleted >= 1  # at least the blob only 'old' had went, while the writer wrote
        snapshots = await store.list_snapshots(run_id=RUN_ID)
        assert [snapshot.step_index for snapshot in snapshots] == [STEPS - 2, STEPS - 1, STEPS]
        for snapshot in snapshots:
            expected = ModelMessagesTypeAdapter.dump_python(history_for(snapshot.step_index), mode='json')
            assert ModelMessagesTypeAdapter.dump_python(snapshot.messages, mode='json') == expected


async def test_the_delete_of_unused_messages_is_correlated_and_indexed(tmp_path: Path) -> None:
    """SQLite's plan: every subquery is correlated with the row being deleted and searches an index."""
    database = tmp_path / 'plan.db'
    async with SqliteStepStore(database) as store:
        await store.migrate()
    statement = str(_DELETE_UNUSED.compile(dialect=sqlite.dialect()))
    with closing(sqlite3.connect(database)) as connection:
        plan = [row[3] for row in connection.execute(f'EXPLAIN QUERY PLAN {statement}')]
    subqueries = [step for step in plan if 'SUBQUERY' in step]
    assert subqueries and all(step.startswith('CORRELATED') for step in subqueries), plan
    searches = [step for step in plan if step.startswith(('SEARCH', 'SCAN'))]
    assert searches[0] == 'SCAN messages', plan
    assert all(step.startswith('SEARCH') and 'INDEX' in step for step in searches[1:]), plan
