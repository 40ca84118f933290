"""A store's own engine runs the statements of a flush straight on its DBAPI connection, storing what Core would.

`stores/sql/prepared.py` executes the hot write statements with a DBAPI cursor instead of
SQLAlchemy Core's execution path, on the engines a store builds itself (SQLite, PostgreSQL from
a URL). These tests pin both halves of that promise: there, a step's writes reach the database
without Core executing any statement, and the rows they leave are the rows the same writes
leave through Core (on an application's engine, where statements always go through Core).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import (
    ContinuableSnapshot,
    PostgresStepStore,
    RunRecord,
    SqliteStepStore,
    SqlStepStore,
    StepEvent,
    ToolEffectRecord,
)
from step_persistence.protocol import StepStore
from step_persistence.records import StepWrites
from step_persistence.testing.conformance import T0
from support.databases import EmptyDatabase
from support.servers.postgres import PostgresServer

pytestmark = pytest.mark.anyio

TABLES = (
    'runs',
    'events',
    'tool_effects',
    'snapshot_keys',
    'snapshots',
    'history_lines',
    'messages',
    'media',
    'conversations',
)


class CoreStatements:
    """The statements SQLAlchemy Core sends to any synchronous engine's cursor while counting."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.sent.append(statement.split()[0].upper() + (' IMMEDIATE' if 'IMMEDIATE' in statement else ''))


@pytest.fixture
def core_statements() -> Iterator[CoreStatements]:
    counter = CoreStatements()
    event.listen(Engine, 'before_cursor_execute', counter)
    yield counter
    event.remove(Engine, 'before_cursor_execute', counter)


def history(step: int) -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content='start', timestamp=T0)])]
    for number in range(step):
        messages.append(ModelResponse(parts=[TextPart(content=f'answer {number}')], timestamp=T0))
        messages.append(ModelRequest(parts=[UserPromptPart(content=f'more {number}', timestamp=T0)]))
    return messages


def step_writes(step: int, *, repeated_event: bool = True) -> StepWrites:
    """What a flush writes at one step: a ledger record, events (one repeated, unless not
    `repeated_event`), a snapshot."""
    status = 'started' if step % 2 else 'completed'
    return StepWrites(
        tool_effects=[
            ToolEffectRecord(
                run_id='r',
                tool_call_id=f'call-{step // 2}',
                tool_name='lookup',
                status=status,
                started_at=T0,
                ended_at=None if status == 'started' else T0 + timedelta(seconds=step),
                effect_summary='charged' if step == 1 else None,
            )
        ],
        events=[
            StepEvent(
                run_id='r', kind='model_request_started', step_index=step, timestamp=T0, idempotency_key=f'e{step}'
            ),
            *(
                [StepEvent(run_id='r', kind='model_request_started', step_index=step, idempotency_key=f'e{step}')]
                if repeated_event
                else []
            ),
            StepEvent(
                run_id='r', kind='tool_call_started', step_index=step, timestamp=T0, metadata={'step': str(step)}
            ),
        ],
        snapshots=[
            ContinuableSnapshot(
                run_id='r', step_index=step, timestamp=T0, messages=history(step), idempotency_key=f's{step}'
            )
        ],
    )


async def write_run(store: StepStore) -> None:
    await store.register_run(RunRecord(run_id='r', conversation_id='c', started_at=T0, metadata={'team': 'x'}))
    for step in range(6):
        await store.write_batch(step_writes(step))  # type: ignore[attr-defined]
    payload = BinaryContent(data=b'\x89PNG' + bytes(range(256)) * 8, media_type='image/png')
    media = ModelRequest(parts=[UserPromptPart(content=['look', payload], timestamp=T0)])
    await store.save_snapshot(
        ContinuableSnapshot(run_id='r', step_index=9, timestamp=T0, messages=[*history(5), media], idempotency_key='s9')
    )


async def table_rows(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of the store's tables, but the media table's clock columns (set when a blob is written)."""
    found: dict[str, list[dict[str, Any]]] = {}
    engine = create_async_engine(url)
    async with engine.connect() as connection:
        for table in TABLES:
            result = await connection.exec_driver_sql(f'SELECT * FROM {table} ORDER BY 1, 2')
            clock = {'created_at', 'touched_at'} if table == 'media' else set[str]()
            found[table] = [
                {name: value for name, value in row.items() if name not in clock} for row in result.mappings()
            ]
    await engine.dispose()
    return found


async def test_a_flush_reaches_sqlite_without_core(tmp_path: Path, core_statements: CoreStatements) -> None:
    async with SqliteStepStore(tmp_path / 'runs.db') as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.write_batch(step_writes(0))
        core_statements.sent.clear()
        await store.write_batch(step_writes(1, repeated_event=False))
    assert core_statements.sent == []


async def test_a_caller_sqlite3_connection_runs_the_flush_on_itself(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / 'app.db', check_same_thread=False)
    traced: list[str] = []
    async with SqliteStepStore(connection=connection) as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.write_batch(step_writes(0))
        connection.set_trace_callback(traced.append)
        await store.write_batch(step_writes(1, repeated_event=False))
        connection.set_trace_callback(None)
    connection.close()
    tables = [
        statement.split()[1 if statement.startswith('UPDATE') else 2]
        for statement in traced
        if statement.startswith(('INSERT INTO', 'UPDATE'))
    ]
    assert list(dict.fromkeys(tables)) == [
        'tool_effects',
        'events',
        'snapshot_keys',
        'runs',
        'history_lines',
        'messages',
        'snapshots',
    ]


@pytest.fixture(params=['sqlite', 'postgresql'])
async def two_databases(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """Two empty databases of one dialect, as async URLs."""
    if request.param == 'sqlite':
        yield f'sqlite+aiosqlite:///{tmp_path / "driver.db"}', f'sqlite+aiosqlite:///{tmp_path / "core.db"}'
        return
    server: PostgresServer = request.getfixturevalue('postgres_server')
    names = [await server.create_database(), await server.create_database()]
    yield server.url(names[0]), server.url(names[1])
    for name in names:
        await server.drop_database(name)


def own_store(url: str) -> SqlStepStore:
    """A store on an engine it builds itself, where the flush statements run on the DBAPI connection."""
    if url.startswith('sqlite'):
        return SqliteStepStore(make_url(url).database, max_snapshots_per_run=2)
    return PostgresStepStore(url, max_snapshots_per_run=2)


async def test_a_flush_reaches_postgres_without_core(
    postgres_database: EmptyDatabase, core_statements: CoreStatements
) -> None:
    async with own_store(postgres_database.url) as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.write_batch(step_writes(0))
        core_statements.sent.clear()
        await store.write_batch(step_writes(1, repeated_event=False))
    assert core_statements.sent == []


async def test_the_driver_path_stores_what_core_stores(two_databases: tuple[str, str]) -> None:
    driver_url, core_url = two_databases
    async with own_store(driver_url) as store:
        await write_run(store)
    engine = create_async_engine(core_url)
    async with SqlStepStore(engine, max_snapshots_per_run=2) as store:
        await write_run(store)
    await engine.dispose()
    driver_rows, core_rows = await table_rows(driver_url), await table_rows(core_url)
    assert all(driver_rows[table] for table in TABLES)
    assert driver_rows == core_rows
