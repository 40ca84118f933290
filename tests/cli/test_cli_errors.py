"""How the command line reports a store it cannot reach, and a database that refuses an operation.

Only a failure to connect or open is "unreachable" (exit 4); a locked database, a missing table or
a refused statement is a database error (exit 5) with the driver's message.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import typer
from pymongo import AsyncMongoClient
from sqlalchemy import create_engine, text

from step_persistence import PostgresStepStore, SqliteStepStore, classify_error
from step_persistence.cli._common import EXIT_DATABASE, EXIT_UNREACHABLE, run
from support.console_script import cli
from support.databases import EmptyDatabase

pytestmark = pytest.mark.anyio


def caught(action: Callable[[], Any]) -> BaseException:
    try:
        action()
    except Exception as error:
        return error
    raise AssertionError('expected an error')


async def caught_async(action: Callable[[], Coroutine[Any, Any, Any]]) -> BaseException:
    try:
        await action()
    except Exception as error:
        return error
    raise AssertionError('expected an error')


def locked_error(path: Path) -> BaseException:
    """The error SQLAlchemy raises for a write to a SQLite database another connection has locked."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute('create table t (x)')
    holder.execute('begin exclusive')
    engine = create_engine(f'sqlite:///{path}', connect_args={'timeout': 0})
    try:

        def write() -> None:
            with engine.begin() as connection:
                connection.execute(text('insert into t values (1)'))

        return caught(write)
    finally:
        engine.dispose()
        holder.close()


def test_a_locked_sqlite_database_is_a_database_error(tmp_path: Path) -> None:
    error = locked_error(tmp_path / 'locked.db')
    assert type(error).__name__ == 'OperationalError' and 'locked' in str(error)
    assert classify_error(error) == 'database'


def test_sqlite_that_cannot_be_opened_is_unreachable(tmp_path: Path) -> None:
    engine = create_engine(f'sqlite:///{tmp_path}')  # a directory
    try:

        def connect() -> None:
            with engine.connect():
                pass

        error = caught(connect)
    finally:
        engine.dispose()
    assert 'unable to open database file' in str(error)
    assert classify_error(error) == 'unreachable'


async def test_missing_tables_are_a_database_error(tmp_path: Path, postgres_database: EmptyDatabase) -> None:
    (tmp_path / 'empty.db').touch()  # a file that does not exist holds nothing: reading it finds nothing
    async with SqliteStepStore(tmp_path / 'empty.db', auto_migrate=False) as sqlite_store:
        sqlite_error = await caught_async(sqlite_store.list_runs)
    async with PostgresStepStore(postgres_database.url, auto_migrate=False) as postgres_store:
        postgres_error = await caught_async(postgres_store.list_runs)
    assert 'no such table' in str(sqlite_error) and 'does not exist' in str(postgres_error)
    assert classify_error(sqlite_error) == classify_error(postgres_error) == 'database'


async def test_connection_failures_are_unreachable(tmp_path: Path) -> None:
    async with PostgresStepStore('postgresql+asyncpg://nobody@127.0.0.1:1/none') as postgres_store:
        refused = await caught_async(postgres_store.list_runs)
    assert classify_error(refused) == 'unreachable'
    client: AsyncMongoClient[Any] = AsyncMongoClient('mongodb://127.0.0.1:1/', serverSelectionTimeoutMS=200)
    try:
        timed_out = await caught_async(lambda: client['db']['runs'].find_one({}))
    finally:
        await client.close()
    assert type(timed_out).__name__ == 'ServerSelectionTimeoutError' and classify_error(timed_out) == 'unreachable'
    assert classify_error(ValueError('not a store problem')) == 'other'


def test_run_gives_each_its_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = locked_error(tmp_path / 'locked.db')

    async def raise_locked() -> None:
        raise locked

    async def raise_refused() -> None:
        raise ConnectionRefusedError(111, 'Connect call failed')

    with pytest.raises(typer.Exit) as exited:
        run(raise_locked)
    assert exited.value.exit_code == EXIT_DATABASE
    assert 'database refused the operation' in capsys.readouterr().err
    with pytest.raises(typer.Exit) as exited:
        run(raise_refused)
    assert exited.value.exit_code == EXIT_UNREACHABLE
    assert 'cannot reach the store' in capsys.readouterr().err


def test_console_script_reports_a_database_without_tables(tmp_path: Path) -> None:
    """A database stamped at the newest revision but holding no tables: not an unreachable server."""
    store = f'sqlite:///{tmp_path / "stamped.db"}'
    (tmp_path / 'stamped.db').touch()  # only `db upgrade` creates a database file
    cli('db', 'stamp', 'head', '--store', store)
    for command in (['runs', 'list'], ['prune', '--older-than', '1d'], ['copy', store, f'file://{tmp_path / "A"}']):
        args = [*command, '--store', store] if command[0] != 'copy' else command
        failed = cli(*args, expect=EXIT_DATABASE)
        assert 'no such table' in failed.stderr and 'cannot reach' not in failed.stderr, command


COMMANDS = [
    ['runs', 'list'],
    ['runs', 'show', 'some-run'],
    ['runs', 'tree', 'some-run'],
    ['runs', 'unresolved'],
    ['report'],
    ['prune', '--older-than', '30d'],
    ['gc'],
    ['recover', '--dry-run'],
]


@pytest.mark.parametrize(
    'url',
    [
        'postgresql://nobody:secret@127.0.0.1:1/none',
        'mongodb://nobody:secret@127.0.0.1:1/none?serverSelectionTimeoutMS=200',
    ],
    ids=['postgres', 'mongo'],
)
def test_every_command_reports_an_unreachable_server(url: str) -> None:
    for command in [*COMMANDS, ['copy', url, 'memory://'], ['copy', 'memory://', url]]:
        args = command if command[0] == 'copy' else [*command, '--store', url]
        unreachable = cli(*args, '--json', expect=EXIT_UNREACHABLE)
        assert 'cannot reach the store' in unreachable.stderr, command
        assert 'secret' not in unreachable.stderr and unreachable.stdout == '', command
