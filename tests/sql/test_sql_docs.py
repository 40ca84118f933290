"""The reporting queries of docs/sql.md run on both databases and find what they describe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore, StepEvent, ToolEffectRecord
from step_persistence.records import RunOrigin
from step_persistence.testing.conformance import sample_history
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio
PAGE = Path(__file__).resolve().parents[2] / 'docs' / 'sql.md'
SQL_BLOCK = re.compile(r'^```sql\n(.*?)^```', re.MULTILINE | re.DOTALL)
ONLY_ON = re.compile(r'^-- (postgresql|sqlite):')


def queries() -> list[str]:
    found = SQL_BLOCK.findall(PAGE.read_text())
    assert len(found) >= 5
    return found


async def test_reporting_queries_run_and_find_rows(empty_database: EmptyDatabase) -> None:
    async with SqlStepStore(empty_database.url) as store:
        await store.register_run(RunRecord(run_id='orchestrator-run', agent_name='orch', metadata={'tenant': 'acme'}))
        await store.register_run(RunRecord(run_id='child-1', agent_name='librarian', parent_run_id='orchestrator-run'))
        await store.append_event(StepEvent(run_id='child-1', kind='tool_call_failed', step_index=1))
        await store.record_tool_effect(
            ToolEffectRecord(run_id='child-1', tool_call_id='t1', tool_name='send_mail', status='started')
        )
        for step in (1, 2):
            history = sample_history(step)
            await store.save_snapshot(ContinuableSnapshot(run_id='child-1', step_index=step, messages=history))
        for turn in range(2):
            origin = None if turn == 0 else RunOrigin(kind='continued', run_id='turn-0', seq=1)
            await store.register_run(RunRecord(run_id=f'turn-{turn}', conversation_id='chat', origin=origin))
            history = sample_history(turn + 1)
            await store.save_snapshot(ContinuableSnapshot(run_id=f'turn-{turn}', step_index=1, messages=history))
    engine = create_async_engine(empty_database.url)
    try:
        async with engine.connect() as connection:
            for query in queries():
                only_on = ONLY_ON.match(query)
                if only_on and only_on.group(1) != empty_database.dialect:
                    continue
                rows = (await connection.execute(text(query))).all()
                assert rows, f'no rows from:\n{query}'
    finally:
        await engine.dispose()
