"""The registry of step-store backends that the conformance and capability suites run against.

Each backend opens a private location per test (temporary directory, database, namespace) and
makes fresh stores there; durable backends also say how another process opens the same data.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from sqlalchemy import Table, func, select
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence import FileStepStore, InMemoryStepStore, PostgresStepStore, SqliteStepStore, StepStore
from step_persistence.stores.file._layout import LINES_DIRECTORY_NAME, MEDIA_DIRECTORY_NAME
from step_persistence.stores.mongo import MongoStepStore
from step_persistence.stores.sql.schema import media, messages
from support.databases import create_application_tables
from support.servers.mongo import Driver, MongoServer
from support.servers.postgres import PostgresServer

StoreMaker = Callable[..., Any]
"""`await make(**options)` returns a new store over the test's location."""


@dataclass
class BackendSession:
    """One test's view of a backend: a store factory and, for durable backends, a `from_spec` spec."""

    make: StoreMaker
    spec: Callable[..., dict[str, Any]] | None = None
    """`from_spec(**spec(**options))` opens the same data in another process; `None` if process-local."""
    count_media_blobs: Callable[[], Awaitable[int]] | None = None
    """`await count_media_blobs()`: how many blobs the default media stores of the session's stores hold,
    counted in the storage itself (files, rows, documents); `None` for a backend that keeps payloads inline."""
    count_stored_messages: Callable[[], Awaitable[int]] | None = None
    """`await count_stored_messages()`: how many stored message versions (rows, journal lines, documents)
    the session's stores hold, counted in the storage itself; `None` for a process-local backend."""


def spec_of(session: BackendSession, **options: Any) -> dict[str, Any]:
    """The `from_spec` arguments that open `session`'s data in another process."""
    assert session.spec is not None, 'a durable backend says how another process opens its data'
    return session.spec(**options)


@dataclass(frozen=True)
class Backend:
    """How to open stores of one backend for one test."""

    name: str
    open: Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[BackendSession]]
    divergences: Mapping[str, str] = field(default_factory=dict)
    """Conformance test name -> why this backend differs; such tests run as strict xfails."""


@asynccontextmanager
async def closing(
    build: Callable[..., StepStore],
    spec: Callable[..., dict[str, Any]] | None = None,
    count_media_blobs: Callable[[], Awaitable[int]] | None = None,
    count_stored_messages: Callable[[], Awaitable[int]] | None = None,
) -> AsyncIterator[BackendSession]:
    """A session whose stores are built by `build(**options)` and closed when the test ends."""
    stores: list[StepStore] = []

    async def make(**options: Any) -> StepStore:
        store = build(**options)
        stores.append(store)
        return store

    try:
        yield BackendSession(
            make=make, spec=spec, count_media_blobs=count_media_blobs, count_stored_messages=count_stored_messages
        )
    finally:
        for store in stores:
            await store.aclose()


def _memory(request: pytest.FixtureRequest) -> AbstractAsyncContextManager[BackendSession]:
    return closing(InMemoryStepStore)


def _file(request: pytest.FixtureRequest) -> AbstractAsyncContextManager[BackendSession]:
    """Each store in a fresh directory; the spec names one more, shared by every process of the test."""
    root: Path = request.getfixturevalue('tmp_path')
    directories = (root / f'file-store-{number}' for number in itertools.count())

    def count_blob_files() -> int:
        files = (path for path in root.glob(f'*/{MEDIA_DIRECTORY_NAME}/**/*') if path.is_file())
        return sum(not path.name.endswith('.meta.json') for path in files)

    async def count_media_blobs() -> int:
        return await anyio.to_thread.run_sync(count_blob_files)

    def count_message_lines() -> int:
        """Lines of every history line's `messages.jsonl` (and of runs' own, written before lines)."""
        journals = [*root.glob(f'*/{LINES_DIRECTORY_NAME}/*/messages.jsonl'), *root.glob('*/*/messages.jsonl')]
        return sum(len(path.read_bytes().splitlines()) for path in set(journals))

    async def count_stored_messages() -> int:
        return await anyio.to_thread.run_sync(count_message_lines)

    return closing(
        lambda **options: FileStepStore(next(directories), **options),
        spec=lambda **options: {'backend': 'file', 'directory': str(root / 'shared-file-store'), **options},
        count_media_blobs=count_media_blobs,
        count_stored_messages=count_stored_messages,
    )


async def _count_rows(urls: list[str], table: Table) -> int:
    """Rows of `table`, summed over the databases at `urls`."""
    total = 0
    for url in urls:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as connection:
                total += (await connection.execute(select(func.count()).select_from(table))).scalar_one()
        finally:
            await engine.dispose()
    return total


def _sqlite(request: pytest.FixtureRequest) -> AbstractAsyncContextManager[BackendSession]:
    """Each store on a fresh SQLite file; the spec names one more, shared by every process of the test."""
    root: Path = request.getfixturevalue('tmp_path')
    files: list[Path] = []

    def build(**options: Any) -> StepStore:
        files.append(root / f'sqlite-{len(files)}.db')
        return SqliteStepStore(files[-1], **options)

    def urls() -> list[str]:
        return [f'sqlite+aiosqlite:///{path}' for path in files]

    async def count_media_blobs() -> int:
        return await _count_rows(urls(), media)

    async def count_stored_messages() -> int:
        return await _count_rows(urls(), messages)

    return closing(
        build,
        spec=lambda **options: {'backend': 'sqlite', 'database': str(root / 'shared.db'), **options},
        count_media_blobs=count_media_blobs,
        count_stored_messages=count_stored_messages,
    )


_POSTGRES_TEMPLATES: dict[tuple[int, str], str] = {}
"""Per cluster (port) and table prefix: a database migrated to head once per session, copied for every test
database."""


async def postgres_template(server: PostgresServer, *, table_prefix: str = '') -> str:
    """A database of `server` migrated to head (made once per cluster), to copy as a test database's template.

    With a `table_prefix`, the store's tables bear it and the database also holds the application's own
    tables named as the store's (`support.databases.APPLICATION_TABLES`)."""
    key = (server.port, table_prefix)
    if key not in _POSTGRES_TEMPLATES:
        name = await server.create_database()
        if table_prefix:
            await create_application_tables(server.url(name))
        store = PostgresStepStore(server.url(name), table_prefix=table_prefix)
        try:
            await store.migrate()
        finally:
            await store.aclose()
        _POSTGRES_TEMPLATES[key] = name
    return _POSTGRES_TEMPLATES[key]


@asynccontextmanager
async def _postgres(request: pytest.FixtureRequest) -> AsyncIterator[BackendSession]:
    """Each store on a fresh database (a copy of a migrated template); all dropped when the test ends."""
    server: PostgresServer = request.getfixturevalue('postgres_server')
    template = await postgres_template(server)
    databases: list[str] = []
    stores: list[StepStore] = []

    async def fresh_url() -> str:
        databases.append(await server.create_database(template=template))
        return server.url(databases[-1])

    shared = await fresh_url()

    async def make(**options: Any) -> StepStore:
        store = PostgresStepStore(await fresh_url(), **options)
        stores.append(store)
        return store

    async def count_media_blobs() -> int:
        return await _count_rows([server.url(database) for database in databases], media)

    async def count_stored_messages() -> int:
        return await _count_rows([server.url(database) for database in databases], messages)

    try:
        yield BackendSession(
            make=make,
            spec=lambda **options: {'backend': shared, **options},
            count_media_blobs=count_media_blobs,
            count_stored_messages=count_stored_messages,
        )
    finally:
        for store in stores:
            await store.aclose()
        for database in databases:
            await server.drop_database(database)


@asynccontextmanager
async def _mongo(request: pytest.FixtureRequest, driver: Driver) -> AsyncIterator[BackendSession]:
    """Each store on a fresh database; the spec (a URL) names one more.

    pymongo's stores are built from the server's URL, each with its own client (as an application's,
    which may use it from several event loops in turn); motor's are given the test's motor client
    (a store builds only pymongo clients). The test's `driver` client counts documents."""
    server: MongoServer = request.getfixturevalue('mongo_server')
    async with server.scratch(driver) as scratch:
        shared = scratch.fresh_database()

        def build(**options: Any) -> MongoStepStore:
            if driver == 'pymongo':
                return MongoStepStore(db_url=server.uri, database=scratch.fresh_database(), **options)
            return MongoStepStore(client=scratch.client, database=scratch.fresh_database(), **options)

        async def count_media_blobs() -> int:
            return sum([await scratch.client[name]['media'].count_documents({}) for name in scratch.databases])

        async def count_stored_messages() -> int:
            """Message documents holding a version (a reclaimed one's tombstone holds none)."""
            stored = {'reclaimed': {'$exists': False}}
            return sum([await scratch.client[name]['messages'].count_documents(stored) for name in scratch.databases])

        async with closing(
            build,
            spec=lambda **options: {'backend': 'mongo', 'db_url': server.uri, 'database': shared, **options},
            count_media_blobs=count_media_blobs,
            count_stored_messages=count_stored_messages,
        ) as session:
            yield session


BACKENDS: dict[str, Backend] = {
    'memory': Backend(
        name='memory',
        open=_memory,
        divergences={
            'test_collect_media_reclaims_unused_messages': 'snapshots own their messages: nothing is left over',
            'test_collect_media_deletes_unreferenced_blobs': 'media stays inline: there are no blobs',
            'test_collect_media_grace_keeps_recent_blobs': 'media stays inline: there are no blobs',
        },
    ),
    'mongo': Backend(name='mongo', open=lambda request: _mongo(request, 'pymongo')),
    'motor': Backend(name='motor', open=lambda request: _mongo(request, 'motor')),
    'file': Backend(
        name='file',
        open=_file,
        divergences={'test_list_runs_by_run_id_prefix_of_any_text': 'run ids are directory names: path-safe only'},
    ),
    'sqlite': Backend(name='sqlite', open=_sqlite),
    'postgres': Backend(name='postgres', open=_postgres),
}
