"""An application's `AsyncSession`: the store writes on the session's connection, inside its transaction.

As with a caller's `AsyncConnection`, the store never commits, rolls back or closes: the
application's `commit()` keeps the store's writes together with its own, its `rollback()` undoes
both, and no run's head is cached (the transaction may still roll back). After a commit or a
rollback, the store's next operation runs in the session's next transaction. On SQLite
(aiosqlite) and the real PostgreSQL server (asyncpg; psycopg in test_sql_psycopg.py), and the
whole conformance suite on SQLite sessions.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart
from sqlalchemy import ForeignKey, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from step_persistence import (
    ContinuableSnapshot,
    PostgresStepStore,
    RunRecord,
    SqliteStepStore,
    SqlStepStore,
    StepEvent,
    StepStore,
    ToolEffectRecord,
)
from step_persistence.stores.sql import SqlMediaStore
from step_persistence.stores.sql.schema import events, media, messages, runs, snapshots, tool_effects
from step_persistence.testing import StepStoreConformance
from step_persistence.testing.conformance import T0, StoreFactory, sample_history
from support.databases import EmptyDatabase, create_application_tables

pytestmark = pytest.mark.anyio


class AppBase(DeclarativeBase):
    pass


class Order(AppBase):
    """A table of the application's own, written in the same transactions as the store's rows."""

    __tablename__ = 'app_orders'
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str]


class Note(AppBase):
    """An application table whose rows reference the store's runs (a foreign key to `runs.run_id`)."""

    __tablename__ = 'app_notes'
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey(runs.c.run_id))


@pytest.fixture
async def engine(empty_database: EmptyDatabase) -> AsyncIterator[AsyncEngine]:
    """The application's engine on a migrated database that also holds the application's `app_orders`."""
    engine = create_async_engine(empty_database.url)
    try:
        await SqlStepStore(engine).migrate()
        async with engine.begin() as connection:
            await connection.run_sync(AppBase.metadata.create_all, tables=[Order.__table__])
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
async def observer(empty_database: EmptyDatabase) -> AsyncIterator[AsyncEngine]:
    """Another engine on the same database: it sees only what was committed."""
    engine = create_async_engine(empty_database.url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def write_a_run(store: StepStore, run_id: str) -> None:
    await store.register_run(RunRecord(run_id=run_id))
    await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='start'))
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, messages=sample_history(1)))
    await store.record_tool_effect(ToolEffectRecord(run_id=run_id, tool_call_id='t', tool_name='x', status='started'))


def dump(history: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(history, mode='json')


async def committed(observer: AsyncEngine) -> dict[str, int]:
    """Rows per table that another connection sees."""
    async with observer.connect() as connection:
        counts = {
            table.name: (await connection.execute(select(func.count()).select_from(table))).scalar_one()
            for table in (runs, events, snapshots, messages, tool_effects, Order.__table__)
        }
    return counts


NOTHING = {'runs': 0, 'events': 0, 'snapshots': 0, 'messages': 0, 'tool_effects': 0, 'app_orders': 0}
ONE_RUN_AND_ORDER = {'runs': 1, 'events': 1, 'snapshots': 1, 'messages': 3, 'tool_effects': 1, 'app_orders': 1}


async def test_the_store_writes_in_the_sessions_transaction_and_the_application_commits(
    engine: AsyncEngine, observer: AsyncEngine
) -> None:
    async with AsyncSession(engine) as session:
        store = SqlStepStore(session)
        session.add(Order(run_id='paid'))
        await write_a_run(store, 'paid')
        assert session.in_transaction()
        assert [run.run_id for run in await store.list_runs()] == ['paid'], 'the session reads its own writes'
        assert await committed(observer) == NOTHING, 'the store committed the session'
        await session.commit()
    assert await committed(observer) == ONE_RUN_AND_ORDER


async def test_a_rollback_undoes_the_stores_writes_with_the_applications(
    engine: AsyncEngine, observer: AsyncEngine
) -> None:
    async with AsyncSession(engine) as session:
        store = SqlStepStore(session)
        session.add(Order(run_id='refused'))
        await session.flush()
        await write_a_run(store, 'refused')
        await session.rollback()
        assert await store.get_run(run_id='refused') is None
        assert await store.list_events(run_id='refused') == []
        assert (await session.execute(select(func.count()).select_from(Order))).scalar_one() == 0
    assert await committed(observer) == NOTHING


async def test_after_a_commit_or_rollback_the_store_writes_in_the_sessions_next_transaction(
    engine: AsyncEngine, observer: AsyncEngine
) -> None:
    async with AsyncSession(engine) as session:
        store = SqlStepStore(session)
        await write_a_run(store, 'first')
        session.add(Order(run_id='first'))
        await session.commit()
        await write_a_run(store, 'second')
        await session.rollback()
        await store.append_event(StepEvent(run_id='first', kind='run_completed', step_index=2))
        await session.commit()
        await write_a_run(store, 'after-close')
        await session.close()  # closing a session rolls back its transaction
        assert [event.kind for event in await store.list_events(run_id='first')] == ['run_started', 'run_completed']
    assert [run.run_id for run in await SqlStepStore(observer).list_runs()] == ['first']
    assert await committed(observer) == {**ONE_RUN_AND_ORDER, 'events': 2}


async def test_a_save_after_a_rollback_builds_only_on_rows_still_stored(
    engine: AsyncEngine, observer: AsyncEngine
) -> None:
    def history(turns: int) -> list[ModelMessage]:
        return [*sample_history(turns), ModelRequest(parts=[UserPromptPart(content=f'after {turns}', timestamp=T0)])]

    async with AsyncSession(engine) as session:
        store = SqlStepStore(session)
        await store.register_run(RunRecord(run_id='chat'))
        await store.save_snapshot(ContinuableSnapshot(run_id='chat', step_index=1, messages=history(1)))
        await session.commit()
        await store.save_snapshot(ContinuableSnapshot(run_id='chat', step_index=2, messages=history(2)))
        await session.rollback()  # the rows of step 2's new messages are gone
        await store.save_snapshot(ContinuableSnapshot(run_id='chat', step_index=3, messages=history(3)))
        await session.commit()
    latest = await SqlStepStore(observer).latest_snapshot(run_id='chat')
    assert latest is not None and latest.step_index == 3
    assert dump(latest.messages) == dump(history(3)), 'the save after the rollback built on rows rolled back'


async def test_the_session_and_its_engine_are_left_open(engine: AsyncEngine, observer: AsyncEngine) -> None:
    async with AsyncSession(engine) as session:
        async with SqlStepStore(session) as store:
            await write_a_run(store, 'pending')
        assert session.in_transaction(), 'closing the store ended the session transaction'
        session.add(Order(run_id='pending'))
        await session.commit()
        async with SqlStepStore(engine) as other:
            assert [run.run_id for run in await other.list_runs()] == ['pending']
    assert await committed(observer) == ONE_RUN_AND_ORDER


async def test_concurrent_operations_on_one_session_take_turns(engine: AsyncEngine, observer: AsyncEngine) -> None:
    async with AsyncSession(engine) as session:
        store = SqlStepStore(session, auto_migrate=False)  # no migration first: the operations start at once
        await asyncio.gather(*(write_a_run(store, f'run-{number}') for number in range(8)))
        await session.commit()
    assert {**await committed(observer), 'app_orders': 1} == {
        'runs': 8,
        'events': 8,
        'snapshots': 8,
        'messages': 24,
        'tool_effects': 8,
        'app_orders': 1,
    }


async def test_an_application_row_may_reference_a_run_written_in_the_same_transaction(
    engine: AsyncEngine, observer: AsyncEngine
) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(AppBase.metadata.create_all, tables=[Note.__table__])
    async with AsyncSession(engine) as session:
        await SqlStepStore(session).register_run(RunRecord(run_id='noted'))
        session.add(Note(run_id='noted'))
        await session.commit()
    async with observer.connect() as connection:
        assert (await connection.execute(select(Note.run_id))).scalars().all() == ['noted']


async def test_blobs_of_the_sessions_media_store_follow_its_transaction(engine: AsyncEngine) -> None:
    async with AsyncSession(engine) as session:
        blobs = SqlMediaStore(session)
        kept = await blobs.put(b'kept' * 100)
        await session.commit()
        dropped = await blobs.put(b'dropped' * 100)
        assert await blobs.exists(dropped)
        await session.rollback()
        assert await blobs.exists(kept) and not await blobs.exists(dropped)
    async with engine.connect() as connection:
        assert (await connection.execute(select(func.count()).select_from(media))).scalar_one() == 1


async def test_the_first_operation_migrates_inside_the_sessions_transaction(empty_database: EmptyDatabase) -> None:
    engine = create_async_engine(empty_database.url)
    try:
        async with AsyncSession(engine) as session:
            await write_a_run(SqlStepStore(session), 'rolled-back')
            await session.rollback()
        assert 'runs' not in await empty_database.table_names(), 'the migration was not in the session transaction'
        async with AsyncSession(engine) as session:
            await write_a_run(SqlStepStore(session), 'kept')
            await session.commit()
        assert [run.run_id for run in await SqlStepStore(engine).list_runs()] == ['kept']
    finally:
        await engine.dispose()


async def test_a_session_joined_to_a_callers_transaction_stays_inside_it(
    engine: AsyncEngine, observer: AsyncEngine
) -> None:
    if engine.dialect.name == 'sqlite':
        pytest.skip("pysqlite's savepoints need SQLAlchemy's BEGIN recipe on the application's engine")
    async with engine.connect() as connection:
        outer = await connection.begin()
        async with AsyncSession(bind=connection, join_transaction_mode='create_savepoint') as session:
            await write_a_run(SqlStepStore(session), 'inner')
            await session.commit()  # releases the savepoint only
        assert await committed(observer) == NOTHING
        await outer.rollback()
    assert await committed(observer) == NOTHING


async def test_the_front_doors_take_a_session_of_their_dialect(engine: AsyncEngine) -> None:
    async with AsyncSession(engine) as session:
        if engine.dialect.name == 'sqlite':
            store: StepStore = SqliteStepStore(session)
            with pytest.raises(ValueError, match='PostgreSQL'):
                PostgresStepStore(session)
        else:
            store = PostgresStepStore(session)
            with pytest.raises(ValueError, match='SQLite'):
                SqliteStepStore(session)
        await write_a_run(store, 'front-door')
        assert 'session on' in repr(store)
        await session.commit()
    assert [run.run_id for run in await SqlStepStore(engine).list_runs()] == ['front-door']


async def test_a_session_bound_to_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match='no default bind'):
        SqlStepStore(AsyncSession())


class TestConformanceOnASession(StepStoreConformance):
    """The whole suite on `SqlStepStore(session, table_prefix='sp_')`, each store on a session of its own over a
    new SQLite file that also holds the application's own `messages`, `runs` and `events`."""

    @pytest.fixture
    async def make_store(self, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StoreFactory]:
        template = tmp_path_factory.getbasetemp() / 'migrated-prefixed-template.db'  # one per test process
        if not template.exists():
            await create_application_tables(f'sqlite+aiosqlite:///{template.with_suffix(".new")}')
            async with SqliteStepStore(template.with_suffix('.new'), table_prefix='sp_') as setup:
                await setup.migrate()
            template.with_suffix('.new').rename(template)
        engines: list[AsyncEngine] = []
        sessions: list[AsyncSession] = []

        async def make(**options: Any) -> StepStore:
            path = tmp_path / f'store-{len(engines)}.db'
            shutil.copyfile(template, path)
            engines.append(create_async_engine(f'sqlite+aiosqlite:///{path}'))
            sessions.append(AsyncSession(engines[-1]))
            return SqlStepStore(sessions[-1], table_prefix='sp_', **options)

        try:
            yield make
        finally:
            for session in sessions:
                await session.close()
            for engine in engines:
                await engine.dispose()
