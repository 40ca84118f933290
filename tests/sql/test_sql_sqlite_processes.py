"""Two OS processes writing runs to one SQLite file at the same time."""

from __future__ import annotations

from pathlib import Path

import pytest

from step_persistence import SqliteStepStore
from support.processes import write_concurrently

pytestmark = pytest.mark.anyio


async def test_two_processes_writing_one_sqlite_file_lose_nothing(tmp_path: Path) -> None:
    database = tmp_path / 'shared.db'
    write_concurrently({'backend': 'sqlite', 'database': str(database)}, ['a', 'b'], count=15)
    async with SqliteStepStore(database) as store:
        for prefix in ('a', 'b'):
            written = await store.list_runs(conversation_id=prefix)
            assert sorted(run.run_id for run in written) == sorted(f'{prefix}-{number}' for number in range(15))
            for run in written:
                assert len(await store.list_events(run_id=run.run_id)) == 3
                assert [s.seq for s in await store.list_snapshots(run_id=run.run_id)] == [1, 2]
                effect = await store.get_tool_effect(run_id=run.run_id, tool_call_id='t')
                assert effect is not None and effect.status == 'completed'
