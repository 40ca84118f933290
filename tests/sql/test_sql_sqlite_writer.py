"""The SQLite writer thread: operations queued together share one transaction, and keep their own outcomes.

Each test holds the writer thread inside a first operation until the others are queued (a
`threading.Event`, never a sleep), so the grouping it asserts is certain, not a timing accident.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from step_persistence.stores.sql.engines import sqlite_engine
from step_persistence.stores.sql.sqlite_writer import SqliteWriter

pytestmark = pytest.mark.anyio


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    engine = sqlite_engine(str(tmp_path / 'w.db'), busy_timeout=5, synchronous='NORMAL', pool_size=2)
    with engine.begin() as connection:
        connection.execute(text('CREATE TABLE parent (id INTEGER PRIMARY KEY)'))
        connection.execute(
            text(
                'CREATE TABLE item (name TEXT UNIQUE, parent INTEGER REFERENCES parent (id) '
                'DEFERRABLE INITIALLY DEFERRED)'
            )
        )
    yield engine
    engine.dispose()


@pytest.fixture
async def writer(engine: Engine) -> AsyncIterator[SqliteWriter]:
    writer = SqliteWriter(engine)
    yield writer
    await asyncio.to_thread(writer.stop)


def insert(name: str, parent: int | None = None) -> Callable[[Connection], str]:
    def operation(connection: Connection) -> str:
        connection.execute(text('INSERT INTO item VALUES (:name, :parent)'), {'name': name, 'parent': parent})
        return name

    return operation


def stored(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return [row[0] for row in connection.execute(text('SELECT name FROM item ORDER BY rowid'))]


def commits(engine: Engine) -> list[int]:
    """A counter of the commits made on `engine` from now on."""
    counted: list[int] = []
    event.listen(engine, 'commit', lambda connection: counted.append(1))
    return counted


async def queued_behind_a_held_operation(
    writer: SqliteWriter, operations: list[Callable[[Connection], str]]
) -> list[str | BaseException]:
    """Run `operations` concurrently, all queued while the writer thread is busy with a first one."""
    holding, release = threading.Event(), threading.Event()

    def hold(connection: Connection) -> str:
        holding.set()
        release.wait(timeout=30)
        return 'held'

    first = asyncio.ensure_future(writer.run(hold, write=True))
    await asyncio.to_thread(holding.wait, 30)
    tasks = [asyncio.ensure_future(writer.run(operation, write=True)) for operation in operations]
    await asyncio.sleep(0)  # let every task submit its operation
    release.set()
    assert await first == 'held'
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def test_operations_queued_together_commit_once_in_order(engine: Engine, writer: SqliteWriter) -> None:
    counted = commits(engine)
    names = [f'item-{number}' for number in range(10)]
    assert await queued_behind_a_held_operation(writer, [insert(name) for name in names]) == names
    assert stored(engine) == names
    assert len(counted) == 2  # the held operation's transaction, then one for the ten queued behind it


async def test_an_operation_that_raises_is_undone_alone(engine: Engine, writer: SqliteWriter) -> None:
    outcomes = await queued_behind_a_held_operation(writer, [insert('a'), insert('b'), insert('a'), insert('c')])
    assert outcomes[:2] == ['a', 'b'] and outcomes[3] == 'c'
    assert isinstance(outcomes[2], IntegrityError)
    assert stored(engine) == ['a', 'b', 'c']


async def test_a_failed_commit_fails_every_operation_of_the_group(engine: Engine, writer: SqliteWriter) -> None:
    outcomes = await queued_behind_a_held_operation(writer, [insert('a'), insert('orphan', parent=7), insert('b')])
    assert all(isinstance(outcome, IntegrityError) for outcome in outcomes)
    assert stored(engine) == []
    assert await writer.run(insert('after'), write=True) == 'after'
    assert stored(engine) == ['after']


async def test_a_cancelled_caller_waits_for_its_write(engine: Engine, writer: SqliteWriter) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(connection: Connection) -> str:
        started.set()
        release.wait(timeout=30)
        return insert('kept')(connection)

    task = asyncio.ensure_future(writer.run(slow, write=True))
    await asyncio.to_thread(started.wait, 30)
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done()  # still waiting for the operation's outcome
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stored(engine) == ['kept']


async def test_the_thread_ends_when_stopped_and_starts_again(engine: Engine, writer: SqliteWriter) -> None:
    def on_which_thread(connection: Connection) -> threading.Thread:
        return threading.current_thread()

    first = await writer.run(on_which_thread, write=True)
    await asyncio.to_thread(writer.stop)
    assert not first.is_alive()
    second = await writer.run(on_which_thread, write=False)
    assert second is not first and second.is_alive()


async def test_a_connection_that_fails_to_open_fails_its_group_and_the_next_one_opens(
    engine: Engine, writer: SqliteWriter
) -> None:
    engine.dispose()  # the fixture's connections are closed: the writer's first checkout connects anew
    refusals = ['disk unavailable']

    @event.listens_for(engine, 'connect')
    def refuse_once(dbapi_connection: object, record: object) -> None:
        if refusals:
            raise OSError(refusals.pop())

    with pytest.raises(OSError, match='disk unavailable'):
        await writer.run(insert('refused'), write=True)
    assert await writer.run(insert('after'), write=True) == 'after'
    assert stored(engine) == ['after']
