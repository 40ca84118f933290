"""Listing runs and conversations, finding and reading snapshots, and deleting a run are answered from
indexes, on SQLite and on PostgreSQL (asserted on query plans: see support/query_plans.py).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore
from step_persistence.records import RunOrigin
from step_persistence.testing.conformance import T0
from step_persistence.testing.conformance.conversations import chat_history
from support.databases import EmptyDatabase
from support.query_plans import (
    assert_no_full_scan,
    assert_no_sort,
    assert_uses_index,
    query_plans,
    statements_sent_by,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def engine(empty_database: EmptyDatabase) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(empty_database.url)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
async def store(engine: AsyncEngine) -> AsyncIterator[SqlStepStore]:
    """A store on `engine` holding a few runs (two conversations, two parents, two agents), snapshots, and a
    chat whose turns continue each other (one of them forked, on a line of its own)."""
    store = SqlStepStore(engine)
    await store.migrate()
    for number in range(12):
        await store.register_run(
            RunRecord(
                run_id=f'run-{number}',
                conversation_id=f'conversation-{number % 2}',
                parent_run_id=f'parent-{number % 3}',
                agent_name=f'agent-{number % 2}',
                started_at=T0,
            )
        )
    history = [ModelRequest.user_text_prompt('hello'), ModelResponse(parts=[TextPart('hi')])]
    for number in range(6):
        await store.save_snapshot(
            ContinuableSnapshot(
                run_id='run-0',
                step_index=number,
                messages=history[: 1 + number % 2],
                state='complete' if number % 2 else 'interrupted',
            )
        )
    for turn in range(4):
        origin = None if turn == 0 else RunOrigin(kind='continued', run_id=f'turn-{turn - 1}', seq=1)
        await store.register_run(RunRecord(run_id=f'turn-{turn}', conversation_id='chat', origin=origin))
        await store.save_snapshot(
            ContinuableSnapshot(
                run_id=f'turn-{turn}', step_index=1, messages=chat_history(turn + 1), conversation_id='chat'
            )
        )
    await store.register_run(
        RunRecord(run_id='fork', conversation_id='chat', origin=RunOrigin(kind='forked', run_id='turn-1', seq=1))
    )
    forked = chat_history(2) + chat_history(1, tag='-fork', start=2)
    await store.save_snapshot(ContinuableSnapshot(run_id='fork', step_index=1, messages=forked, conversation_id='chat'))
    yield store
    await store.aclose()


_PLANNED = ('SELECT', 'WITH', 'UPDATE', 'DELETE')
TABLES = ('runs', 'conversations', 'snapshots', 'snapshot_keys', 'events', 'tool_effects', 'history_lines', 'messages')


@pytest.mark.parametrize(
    ('filters', 'index'),
    [
        ({'conversation_id': 'conversation-1'}, 'ix_runs_conversation_id_started_at_id'),
        ({'parent_run_id': 'parent-2'}, 'ix_runs_parent_run_id_started_at_id'),
        ({}, 'ix_runs_started_at_id'),
    ],
    ids=['by conversation', 'by parent', 'all'],
)
async def test_list_runs_reads_an_index_in_order(
    engine: AsyncEngine, store: SqlStepStore, filters: dict[str, str], index: str
) -> None:
    (plan,) = await query_plans(engine, lambda: store.list_runs(**filters))
    assert_uses_index(plan, 'runs', index)
    assert_no_sort(plan)


@pytest.mark.parametrize('include_interrupted', [False, True], ids=['complete', 'any state'])
async def test_latest_snapshot_reads_indexes(
    engine: AsyncEngine, store: SqlStepStore, include_interrupted: bool
) -> None:
    header, *messages = await query_plans(
        engine, lambda: store.latest_snapshot(run_id='run-0', include_interrupted=include_interrupted)
    )
    # The newest snapshot of the run comes from the (run_id, state, seq) index or the (run_id, seq)
    # primary key, read backwards: no scan of the run's snapshots and no sort.
    # (SQLite names the index of a composite primary key `sqlite_autoindex_<table>_1`.)
    primary_key = '(pk_snapshots|sqlite_autoindex_snapshots_1)'
    index = (
        'ix_snapshots_run_id_state_seq' if not include_interrupted else f'(ix_snapshots_run_id_state_seq|{primary_key})'
    )
    assert_uses_index(header, 'snapshots', index)
    assert_no_sort(header)
    # Its history: the line's base (by primary key), then the newest row per position of the line, from the
    # line's rows in the messages index.
    assert any('messages' in plan for plan in messages), 'the snapshot was read without its messages'
    for plan in messages:
        for table in TABLES:
            assert_no_full_scan(plan, table)
        if 'messages' in plan:
            assert re.search(r'ix_messages_line_id_position_no|pk_messages|sqlite_autoindex_messages_1', plan), plan


async def test_a_branch_is_read_one_indexed_query_per_line(engine: AsyncEngine, store: SqlStepStore) -> None:
    plans = await query_plans(engine, lambda: store.latest_snapshot(run_id='fork'))
    segments = [plan for plan in plans if 'messages' in plan]
    assert len(segments) == 2, plans
    for plan in plans:
        for table in TABLES:
            assert_no_full_scan(plan, table)


@pytest.mark.parametrize(
    ('filters', 'index'),
    [
        ({'conversation_id': 'chat'}, 'ix_runs_conversation_id_started_at_id'),
        ({'agent_name': 'agent-1'}, 'ix_runs_agent_name_started_at_id'),
        ({'origin_run_id': 'turn-1'}, 'ix_runs_origin_run_id_started_at_id'),
        ({}, 'ix_runs_started_at_id'),
    ],
    ids=['by conversation', 'by agent', 'by origin', 'all'],
)
async def test_the_newest_runs_are_read_from_an_index_in_order_up_to_the_limit(
    engine: AsyncEngine, store: SqlStepStore, filters: dict[str, str], index: str
) -> None:
    [(statement, _)] = await statements_sent_by(engine, lambda: store.list_runs(**filters, limit=20, newest_first=True))
    assert re.search(r'\bLIMIT\b', statement), statement
    (plan,) = await query_plans(engine, lambda: store.list_runs(**filters, limit=20, newest_first=True))
    assert_uses_index(plan, 'runs', index)
    assert_no_sort(plan)


@pytest.mark.parametrize('newest_first', [True, False], ids=['newest first', 'oldest first'])
async def test_list_conversations_reads_the_summaries_index_in_order(
    engine: AsyncEngine, store: SqlStepStore, newest_first: bool
) -> None:
    (plan,) = await query_plans(engine, lambda: store.list_conversations(limit=20, newest_first=newest_first))
    assert_uses_index(plan, 'conversations', 'ix_conversations_last_started_at_conversation_id')
    assert_no_sort(plan)


async def test_list_conversations_of_an_agent_reads_its_runs_from_an_index(
    engine: AsyncEngine, store: SqlStepStore
) -> None:
    (plan,) = await query_plans(engine, lambda: store.list_conversations(limit=20, agent_name='agent-1'))
    assert_uses_index(plan, 'runs', 'ix_runs_agent_name_conversation_id_started_at_id')


async def test_find_snapshot_reads_the_history_digest_index(engine: AsyncEngine, store: SqlStepStore) -> None:
    latest = await store.latest_snapshot(run_id='turn-2')
    assert latest is not None
    digest = latest.history_digest()
    (plan,) = await query_plans(engine, lambda: store.find_snapshot(conversation_id='chat', history_digest=digest))
    assert_uses_index(plan, 'snapshots', 'ix_snapshots_conversation_id_history_digest')
    assert_no_full_scan(plan, 'runs')


@pytest.mark.parametrize('run_id', ['turn-1', 'turn-3', 'fork', 'run-0'])
async def test_deleting_a_run_reads_only_what_it_touches(engine: AsyncEngine, store: SqlStepStore, run_id: str) -> None:
    """Every statement of a delete (the run, its children, its conversation's summary, the rows of its lines)
    reads through an index: none scans a table."""
    plans = await query_plans(engine, lambda: store.delete_run(run_id=run_id), kinds=_PLANNED)
    assert any('messages' in plan for plan in plans), plans
    for plan in plans:
        for table in TABLES:
            assert_no_full_scan(plan, table)
