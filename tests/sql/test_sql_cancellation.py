"""A caller cancelled while its SQL operation is in flight.

On an application's aiosqlite engine the operation finishes and its connection survives:
aiosqlite's connections do not survive a statement interrupted by a cancellation (SQLAlchemy
invalidates them, and the close it starts can leave a task that the event loop waits for
forever when it shuts down). On PostgreSQL the operation is interrupted: a transaction rolls back
whole, a flush in one statement lands whole or not at all, and the store goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic_ai.messages import ModelRequest, UserPromptPart
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import Pool

from step_persistence import ContinuableSnapshot, RunRecord, SqlStepStore, StepEvent
from step_persistence.records import StepWrites
from step_persistence.testing.conformance import T0
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio

SNAPSHOT = ContinuableSnapshot(
    run_id='r', step_index=1, messages=[ModelRequest(parts=[UserPromptPart(content='hello', timestamp=T0)])]
)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(f'sqlite+aiosqlite:///{tmp_path / "app.db"}')
    async with SqlStepStore(engine) as store:
        await store.migrate()
        await store.register_run(RunRecord(run_id='r'))
    yield engine
    await engine.dispose()


def invalidations(engine: AsyncEngine) -> list[BaseException | None]:
    """A list that collects, from now on, the errors for which the engine's pool drops a connection."""
    dropped: list[BaseException | None] = []

    @event.listens_for(engine.sync_engine, 'invalidate')
    def collect(connection: Any, record: Any, error: BaseException | None) -> None:
        dropped.append(error)

    return dropped


def on_first_write(engine: AsyncEngine, cancel: Callable[[], None]) -> None:
    """Call `cancel` while the first write the engine sends from now on (an `INSERT`, or a `WITH` statement:
    PostgreSQL's flush in one statement) is about to run."""

    cancelled: list[str] = []

    @event.listens_for(engine.sync_engine, 'before_cursor_execute')
    def cancel_once(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not cancelled and statement.lstrip().upper().startswith(('INSERT', 'WITH')):
            cancelled.append(statement)
            cancel()


def started_since(tasks: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    """The tasks not yet done, other than `tasks` and the current one."""
    return asyncio.all_tasks() - tasks - {asyncio.current_task()}


async def test_an_anyio_cancellation_lets_the_save_in_flight_commit(engine: AsyncEngine) -> None:
    dropped, running = invalidations(engine), asyncio.all_tasks()
    async with SqlStepStore(engine) as store:
        with anyio.CancelScope() as scope:
            on_first_write(engine, scope.cancel)
            await store.save_snapshot(SNAPSHOT)
            await anyio.lowlevel.checkpoint()
            pytest.fail('the cancellation was not delivered after the save')
        assert scope.cancelled_caught
        assert [s.seq for s in await store.list_snapshots(run_id='r')] == [1]
    assert dropped == [], 'no connection was interrupted'
    assert started_since(running) == set(), 'no task was left behind'


async def test_an_asyncio_cancellation_is_raised_once_the_save_has_committed(engine: AsyncEngine) -> None:
    dropped, running = invalidations(engine), asyncio.all_tasks()
    async with SqlStepStore(engine) as store:
        saving = asyncio.ensure_future(store.save_snapshot(SNAPSHOT))
        on_first_write(engine, saving.cancel)
        with pytest.raises(asyncio.CancelledError):
            await saving
        assert [s.seq for s in await store.list_snapshots(run_id='r')] == [1]
    assert dropped == [], 'no connection was interrupted'
    assert started_since(running) == set(), 'no task was left behind'


async def test_a_cancelled_postgres_save_rolls_back_whole_and_the_store_goes_on(
    postgres_database: EmptyDatabase,
) -> None:
    """A batch of two runs' writes is a transaction (`BEGIN`, its statements, `COMMIT`): interrupted at its
    first `INSERT`, it leaves nothing."""
    engine = create_async_engine(postgres_database.url)
    dropped, running = invalidations(engine), asyncio.all_tasks()
    other = StepEvent(run_id='other', kind='run_started', step_index=0)
    try:
        async with SqlStepStore(engine) as store:
            await store.migrate()
            await store.register_run(RunRecord(run_id='r'))
            with anyio.CancelScope() as scope:
                on_first_write(engine, scope.cancel)
                await store.write_batch(StepWrites(events=[other], snapshots=[SNAPSHOT]))
            assert scope.cancelled_caught
            assert await store.list_snapshots(run_id='r') == [], 'the interrupted save left nothing'
            assert await store.get_run(run_id='other') is None
            await store.save_snapshot(SNAPSHOT)
            assert [s.seq for s in await store.list_snapshots(run_id='r')] == [1]
        assert len(dropped) == 1, 'the interrupted connection was dropped'
    finally:
        await engine.dispose()
    closing = started_since(running)  # SQLAlchemy closes a dropped asyncpg connection within its 2 s timeout
    if closing:
        await asyncio.wait(closing, timeout=10)
    assert started_since(running) == set(), 'no task was left behind'


async def test_a_cancelled_postgres_flush_in_one_statement_lands_whole_or_not_at_all(
    postgres_database: EmptyDatabase,
) -> None:
    """A flush of one run is one statement in autocommit (`flush_statement.py`): interrupted in flight, it
    committed whole or not at all, and the store goes on."""
    engine = create_async_engine(postgres_database.url)
    running = asyncio.all_tasks()
    started = StepEvent(run_id='r', kind='model_request_started', step_index=1)
    try:
        async with SqlStepStore(engine) as store:
            await store.migrate()
            await store.register_run(RunRecord(run_id='r'))
            with anyio.CancelScope() as scope:
                on_first_write(engine, scope.cancel)
                await store.write_batch(StepWrites(events=[started], snapshots=[SNAPSHOT]))
            assert scope.cancelled_caught
            landed = await store.list_snapshots(run_id='r')
            events = await store.list_events(run_id='r')
            assert (len(landed), len(events)) in ((0, 0), (1, 1)), 'all of the flush or nothing'
            assert all(s.messages == SNAPSHOT.messages for s in landed)
            await store.save_snapshot(SNAPSHOT)
            assert [s.seq for s in await store.list_snapshots(run_id='r')] == list(range(1, len(landed) + 2))
    finally:
        await engine.dispose()
    closing = started_since(running)
    if closing:
        await asyncio.wait(closing, timeout=10)
    assert started_since(running) == set(), 'no task was left behind'


class _CancelAtFlush:
    """An asyncpg protocol that, once armed (a cancel function in `armed`), calls it as it sends the next flush
    statement (a `WITH`), which is then in flight."""

    def __init__(self, protocol: Any, armed: list[Callable[[], None]]) -> None:
        self._protocol = protocol
        self._armed = armed

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._protocol, name)
        if name != 'bind_execute':
            return attribute

        def bind_execute(statement: Any, *args: Any, **kwargs: Any) -> Any:
            sent = attribute(statement, *args, **kwargs)
            if self._armed and str(statement.query).lstrip().upper().startswith('WITH'):
                self._armed.pop()()
            return sent

        return bind_execute


async def test_a_cancelled_flush_on_the_stores_own_engine_lands_whole_or_not_and_its_connection_is_dropped(
    postgres_database: EmptyDatabase,
) -> None:
    """On the store's own engine the flush statement runs straight on a pooled driver connection
    (`executors.py`): interrupted in flight, it committed whole or not at all, the connection (asyncpg
    still cancelling its statement) is dropped rather than handed out again, and the store goes on."""
    running = asyncio.all_tasks()
    armed: list[Callable[[], None]] = []
    dropped: list[BaseException | None] = []
    started = StepEvent(run_id='r', kind='model_request_started', step_index=1)

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        driver = dbapi_connection.driver_connection
        driver._protocol = _CancelAtFlush(driver._protocol, armed)

    def on_invalidate(dbapi_connection: Any, record: Any, error: BaseException | None) -> None:
        dropped.append(error)

    event.listen(Pool, 'connect', on_connect)
    event.listen(Pool, 'invalidate', on_invalidate)
    try:
        async with SqlStepStore(postgres_database.url) as store:
            await store.migrate()
            await store.register_run(RunRecord(run_id='r'))
            with anyio.CancelScope() as scope:
                armed.append(scope.cancel)
                await store.write_batch(StepWrites(events=[started], snapshots=[SNAPSHOT]))
            assert scope.cancelled_caught
            assert not armed, 'the flush statement was in flight when cancelled'
            assert len(dropped) == 1, 'the interrupted connection was dropped'
            landed = await store.list_snapshots(run_id='r')
            events = await store.list_events(run_id='r')
            assert (len(landed), len(events)) in ((0, 0), (1, 1)), 'all of the flush or nothing'
            await store.save_snapshot(SNAPSHOT)
            assert [s.seq for s in await store.list_snapshots(run_id='r')] == list(range(1, len(landed) + 2))
    finally:
        event.remove(Pool, 'connect', on_connect)
        event.remove(Pool, 'invalidate', on_invalidate)
    closing = started_since(running)
    if closing:
        await asyncio.wait(closing, timeout=10)
    assert started_since(running) == set(), 'no task was left behind'
