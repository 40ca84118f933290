"""The registry of media stores that the media conformance suite runs against.

Each backend opens a private location per test (a temporary directory, a key prefix in the
session's bucket, ...) and makes fresh stores there. `corrupt` overwrites a stored blob's bytes
behind the store's back, so that tests can check that reads notice. To add a backend, write an
`open` function and register it in `MEDIA_BACKENDS`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import create_async_engine

from step_persistence.media import (
    DiskMediaStore,
    MediaContext,
    MediaStore,
    PostgresMediaStore,
    S3MediaStore,
    SqliteMediaStore,
    parse_media_uri,
)
from step_persistence.stores.mongo.media_store import MongoMediaStore
from step_persistence.stores.sql.schema import media
from support.servers.mongo import Driver, MongoServer
from support.servers.postgres import PostgresServer
from support.servers.s3 import S3Server

MediaStoreMaker = Callable[..., MediaStore]
"""`make(**options)` returns a new store over the test's location; options: `key_strategy`, `public_url`."""

Corruptor = Callable[[MediaStore, str, MediaContext, bytes], Awaitable[None]]
"""`await corrupt(store, uri, context, data)` replaces the stored bytes of the blob at `uri` with `data`."""


@dataclass
class MediaSession:
    """One test's view of a media backend."""

    make: MediaStoreMaker
    corrupt: Corruptor


@dataclass(frozen=True)
class MediaBackend:
    """How to open media stores of one kind for one test."""

    name: str
    open: Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[MediaSession]]
    divergences: Mapping[str, str] = field(default_factory=dict)
    """Conformance test name -> why this backend differs; such tests run as strict xfails."""


@asynccontextmanager
async def closing(build: Callable[..., Any], corrupt: Corruptor) -> AsyncIterator[MediaSession]:
    """A session whose stores are built by `build(**options)` and closed (`aclose`) when the test ends."""
    stores: list[Any] = []

    def make(**options: Any) -> MediaStore:
        store = build(**options)
        stores.append(store)
        return store

    try:
        yield MediaSession(make=make, corrupt=corrupt)
    finally:
        for store in stores:
            await store.aclose()


async def _corrupt_file(store: MediaStore, uri: str, context: MediaContext, data: bytes) -> None:
    assert isinstance(store, DiskMediaStore)
    store.path_for(uri, context=context).write_bytes(data)


def _disk(request: pytest.FixtureRequest) -> AbstractAsyncContextManager[MediaSession]:
    directory = request.getfixturevalue('tmp_path') / 'media'
    return closing(lambda **options: DiskMediaStore(directory, **options), _corrupt_file)


def _s3(request: pytest.FixtureRequest) -> AbstractAsyncContextManager[MediaSession]:
    server: S3Server = request.getfixturevalue('s3_server')
    prefix = f'conformance-{uuid.uuid4().hex}/'

    async def corrupt(store: MediaStore, uri: str, context: MediaContext, data: bytes) -> None:
        assert isinstance(store, S3MediaStore)
        await anyio.to_thread.run_sync(server.put_object, store.key_for(uri, context=context), data)

    def build(**options: Any) -> S3MediaStore:
        return S3MediaStore(
            server.bucket,
            server.endpoint,
            server.region,
            server.access_key_id,
            server.secret_access_key,
            key_prefix=prefix,
            **options,
        )

    return closing(build, corrupt)


@asynccontextmanager
async def _mongo(request: pytest.FixtureRequest, driver: Driver) -> AsyncIterator[MediaSession]:
    """The test's stores share a fresh database, reached through one `driver` client."""
    server: MongoServer = request.getfixturevalue('mongo_server')
    async with server.scratch(driver) as scratch:
        database = scratch.client[scratch.fresh_database()]

        async def corrupt(store: MediaStore, uri: str, context: MediaContext, data: bytes) -> None:
            assert isinstance(store, MongoMediaStore)
            manifest = await database['media'].find_one({'_id': store.key_for(uri, context=context)})
            await database['media_chunks'].update_one({'files_id': manifest['files_id']}, {'$set': {'data': data}})

        async with closing(
            lambda **options: MongoMediaStore(client=scratch.client, database=database.name, **options), corrupt
        ) as session:
            yield session


def _corrupt_sql(url: str) -> Corruptor:
    async def corrupt(store: MediaStore, uri: str, context: MediaContext, data: bytes) -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as connection:
                await connection.execute(update(media).where(media.c.digest == parse_media_uri(uri)).values(data=data))
        finally:
            await engine.dispose()

    return corrupt


def _sqlite(request: pytest.FixtureRequest) -> AbstractAsyncContextManager[MediaSession]:
    """The test's stores share a fresh SQLite file."""
    database = request.getfixturevalue('tmp_path') / 'media.db'
    return closing(
        lambda **options: SqliteMediaStore(database, **options), _corrupt_sql(f'sqlite+aiosqlite:///{database}')
    )


@asynccontextmanager
async def _postgres(request: pytest.FixtureRequest) -> AsyncIterator[MediaSession]:
    """The test's stores share a fresh PostgreSQL database, dropped afterwards."""
    server: PostgresServer = request.getfixturevalue('postgres_server')
    name = await server.create_database()
    try:
        async with closing(
            lambda **options: PostgresMediaStore(server.url(name), **options), _corrupt_sql(server.url(name))
        ) as session:
            yield session
    finally:
        await server.drop_database(name)


_SQL_DIVERGENCES = {
    name: 'SQL rows are addressed by the digest: the SQL media store takes no key strategy'
    for name in ('test_custom_key_strategy', 'test_unsafe_keys_are_rejected')
}

MEDIA_BACKENDS: dict[str, MediaBackend] = {
    'disk': MediaBackend(name='disk', open=_disk),
    'mongo': MediaBackend(name='mongo', open=lambda request: _mongo(request, 'pymongo')),
    'motor': MediaBackend(name='motor', open=lambda request: _mongo(request, 'motor')),
    'postgres': MediaBackend(name='postgres', open=_postgres, divergences=_SQL_DIVERGENCES),
    's3': MediaBackend(name='s3', open=_s3),
    'sqlite': MediaBackend(name='sqlite', open=_sqlite, divergences=_SQL_DIVERGENCES),
}
