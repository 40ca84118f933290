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

from servers.mongo import Driver, MongoServer
from servers.s3 import S3Server
from step_persistence.media import DiskMediaStore, MediaContext, MediaStore, S3MediaStore
from step_persistence.media.mongo import MongoMediaStore

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


MEDIA_BACKENDS: dict[str, MediaBackend] = {
    'disk': MediaBackend(name='disk', open=_disk),
    'mongo': MediaBackend(name='mongo', open=lambda request: _mongo(request, 'pymongo')),
    'motor': MediaBackend(name='motor', open=lambda request: _mongo(request, 'motor')),
    's3': MediaBackend(name='s3', open=_s3),
}
