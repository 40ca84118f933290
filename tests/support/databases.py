"""Fresh, empty SQL databases for the SQL store's own tests, on SQLite and on the session's PostgreSQL.

The fixtures are registered in tests/conftest.py (a `conftest.py` here would shadow that one as the
module `conftest`, which some tests import from).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from support.servers.postgres import PostgresServer

APPLICATION_TABLES = frozenset({'messages', 'runs', 'events'})
"""Tables of an application named as the store's (what a chat application usually has), for stores given a
`table_prefix`."""

_APPLICATION_TABLES_SQL = (
    'CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)',
    'CREATE TABLE runs (id INTEGER PRIMARY KEY, label TEXT)',
    'CREATE TABLE events (id INTEGER PRIMARY KEY)',
    "INSERT INTO messages (id, body) VALUES (1, 'hello from the app')",
    "INSERT INTO runs (id, label) VALUES (7, 'nightly')",
)


async def create_application_tables(url: str) -> None:
    """Create `APPLICATION_TABLES` (with a row in `messages` and one in `runs`) in the database at `url`."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            for statement in _APPLICATION_TABLES_SQL:
                await connection.execute(text(statement))
    finally:
        await engine.dispose()


@dataclass(frozen=True)
class EmptyDatabase:
    """A database with nothing in it yet, and its async SQLAlchemy URL."""

    dialect: str
    """`'sqlite'` or `'postgresql'`."""
    url: str

    async def table_names(self, schema: str | None = None) -> set[str]:
        engine = create_async_engine(self.url)
        try:
            async with engine.connect() as connection:
                names = await connection.run_sync(lambda sync: inspect(sync).get_table_names(schema=schema))
        finally:
            await engine.dispose()
        return set(names)

    async def view_names(self, schema: str | None = None) -> set[str]:
        engine = create_async_engine(self.url)
        try:
            async with engine.connect() as connection:
                names = await connection.run_sync(lambda sync: inspect(sync).get_view_names(schema=schema))
        finally:
            await engine.dispose()
        return set(names)


async def fresh_postgres_database(request: pytest.FixtureRequest) -> AsyncIterator[EmptyDatabase]:
    server: PostgresServer = request.getfixturevalue('postgres_server')
    name = await server.create_database()
    try:
        yield EmptyDatabase(dialect='postgresql', url=server.url(name))
    finally:
        await server.drop_database(name)


@pytest.fixture(params=['sqlite', 'postgresql'])
async def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EmptyDatabase]:
    """A new SQLite file, or a new database on the session's PostgreSQL cluster (dropped afterwards)."""
    if request.param == 'sqlite':
        yield EmptyDatabase(dialect='sqlite', url=f'sqlite+aiosqlite:///{tmp_path / "test.db"}')
    else:
        async for database in fresh_postgres_database(request):
            yield database


@pytest.fixture
async def postgres_database(request: pytest.FixtureRequest) -> AsyncIterator[EmptyDatabase]:
    """A new, empty database on the session's PostgreSQL cluster."""
    async for database in fresh_postgres_database(request):
        yield database


def statements_sent(engine: AsyncEngine, prefix: str) -> list[str]:
    """A list that collects, from now on, the statements `engine` sends that start with `prefix` (any case)."""
    sent: list[str] = []

    @event.listens_for(engine.sync_engine, 'before_cursor_execute')
    def collect(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith(prefix.upper()):
            sent.append(statement)

    return sent


async def wait_until_a_connection_waits_for_a_lock(engine: AsyncEngine, *, connections: int = 1) -> None:
    """Return once `connections` other connections of this database wait for a lock (a bounded number of looks).

    Each look is a transaction of its own: PostgreSQL reads `pg_stat_activity` once per transaction and
    shows that snapshot until it ends, so repeated looks in one transaction would never see a later wait.
    """
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    async with engine.connect() as observer:
        for _ in range(10_000):
            waiting = (await observer.execute(query)).scalar_one()
            await observer.rollback()
            if waiting >= connections:
                return
    raise AssertionError(f'fewer than {connections} connection(s) waited for a lock')
