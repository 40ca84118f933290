"""The media API as the seed writes it (issue 19, items 2 and 3): key strategies called with the URI,
and the constructor forms and defaults it shows, on the real stores (disk, S3, MongoDB)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from step_persistence.media import (
    DiskMediaStore,
    KeyStrategy,
    MediaContext,
    MongoMediaStore,
    S3MediaStore,
    make_static_public_url,
    media_uri_for,
)
from step_persistence.stores.mongo.media_store import DEFAULT_CHUNK_SIZE_BYTES
from support.servers.mongo import MongoServer
from support.servers.s3 import S3Server

pytestmark = pytest.mark.anyio

PNG, JPEG, PDF = (MediaContext(media_type=kind) for kind in ('image/png', 'image/jpeg', 'application/pdf'))


def by_media_type(uri: str, ctx: MediaContext) -> str:
    """The seed's example strategy, as the seed writes it."""
    digest = uri.removeprefix('media+sha256://')
    ext = {'image/png': '.png', 'image/jpeg': '.jpg'}.get(ctx.media_type or '', '.bin')
    return f'images/{digest}{ext}'


def seed_keys(data: bytes) -> list[tuple[MediaContext, str]]:
    """The keys the seed's example says `by_media_type` gives `data` under each context."""
    digest = media_uri_for(data).removeprefix('media+sha256://')
    return [(PNG, f'images/{digest}.png'), (JPEG, f'images/{digest}.jpg'), (PDF, f'images/{digest}.bin')]


def s3_store(server: S3Server, **options: Any) -> S3MediaStore:
    """An `S3MediaStore` built with the seed's keyword form."""
    return S3MediaStore(
        bucket=server.bucket,
        endpoint=server.endpoint,
        region=server.region,
        access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key,
        **options,
    )


@pytest.fixture
async def mongo_database(mongo_server: MongoServer) -> AsyncIterator[tuple[Any, str]]:
    async with mongo_server.scratch() as scratch:
        yield scratch.client, scratch.fresh_database()


# --- item 2: a key strategy is called with the URI ---


async def test_the_seeds_strategy_files_disk_blobs_where_the_seed_says(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path, key_strategy=by_media_type)
    for context, key in seed_keys(b'photo'):
        uri = await store.put(b'photo', context=context)
        assert (tmp_path / key).read_bytes() == b'photo'
        assert store.path_for(uri, context=context) == tmp_path / key
        assert await store.get(uri, context=context) == b'photo'


async def test_the_seeds_strategy_names_s3_objects_where_the_seed_says(s3_server: S3Server) -> None:
    prefix = f'seed-{uuid.uuid4().hex}/'
    async with s3_store(s3_server, key_prefix=prefix, key_strategy=by_media_type) as store:
        for context, key in seed_keys(b'photo'):
            uri = await store.put(b'photo', context=context)
            assert store.key_for(uri, context=context) == prefix + key
            response = await anyio.to_thread.run_sync(s3_server.request, 'GET', f'/{s3_server.bucket}/{prefix}{key}')
            assert (response.status_code, response.content) == (200, b'photo')


async def test_the_seeds_strategy_names_mongo_manifests_where_the_seed_says(mongo_database: tuple[Any, str]) -> None:
    client, database = mongo_database
    async with MongoMediaStore(client=client, database=database, key_strategy=by_media_type) as store:
        for context, key in seed_keys(b'photo'):
            uri = await store.put(b'photo', context=context)
            assert store.key_for(uri, context=context) == key
            assert await client[database]['media'].find_one({'_id': key}, {'digest': 1}) == {
                '_id': key,
                'digest': uri.removeprefix('media+sha256://'),
            }
            assert await store.get(uri, context=context) == b'photo'


@pytest.mark.parametrize(
    'strategy',
    [lambda uri, ctx: uri, lambda uri, ctx: f'../{uri[15:]}', lambda uri, ctx: '/' + uri[15:]],
    ids=['the URI itself', 'a parent segment', 'absolute'],
)
async def test_what_a_strategy_returns_is_still_checked(tmp_path: Path, strategy: KeyStrategy) -> None:
    """`media+sha256://<hex>` as a key would have an empty segment (`//`), like the others it is refused."""
    store = DiskMediaStore(tmp_path / 'media', key_strategy=strategy)
    with pytest.raises(ValueError, match='key strategy'):
        await store.put(b'escape')
    assert not (tmp_path / 'media').exists()


async def test_a_strategy_never_sees_a_malformed_uri(tmp_path: Path) -> None:
    seen: list[str] = []

    def spy(uri: str, ctx: MediaContext) -> str:
        seen.append(uri)
        return uri.removeprefix('media+sha256://')

    store = DiskMediaStore(tmp_path, key_strategy=spy)
    with pytest.raises(ValueError, match='not a media URI'):
        await store.get('media+sha256://' + 'AB' * 32)
    uri = await store.put(b'ok')
    assert seen == [uri]


async def test_the_seeds_presigner_computes_the_key_the_s3_store_uses(s3_server: S3Server) -> None:
    """The seed's `presign` builds `'media/' + <digest> + '.bin'`: the default key under `key_prefix='media/'`."""
    signed: list[tuple[str, str | None]] = []

    async def presign(uri: str, ctx: MediaContext) -> str:
        key = 'media/' + uri.removeprefix('media+sha256://') + '.bin'
        signed.append((key, ctx.media_type))
        return f'https://signed.example/{key}?ttl=3600'

    async with s3_store(s3_server, key_prefix='media/', public_url=presign) as store:
        uri = await store.put(b'report', context=PDF)
        assert await store.public_url(uri, context=PDF) == f'https://signed.example/{store.key_for(uri)}?ttl=3600'
        assert signed == [(store.key_for(uri), 'application/pdf')]


# --- item 3: constructor forms and defaults ---


async def test_disk_store_default_is_one_bin_file_per_blob(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'blob')
    assert (tmp_path / f'{uri.removeprefix("media+sha256://")}.bin').read_bytes() == b'blob'


async def test_the_seeds_static_url_matches_the_s3_stores_keys(s3_server: S3Server) -> None:
    public_url = make_static_public_url('https://pub-abc.r2.dev', key_prefix='media/')
    async with s3_store(s3_server, key_prefix='media/', public_url=public_url) as store:
        uri = await store.put(b'public')
        assert await store.public_url(uri) == f'https://pub-abc.r2.dev/{store.key_for(uri)}'
        assert store.key_for(uri) == f'media/{uri.removeprefix("media+sha256://")}.bin'


@pytest.mark.parametrize(
    ('options', 'key'),
    [
        ({}, '{digest}.bin'),
        ({'extension': '.png'}, '{digest}.png'),
        ({'extension': ''}, '{digest}'),
        ({'key_prefix': 'media/', 'extension': '.jpg'}, 'media/{digest}.jpg'),
        ({'key_strategy': by_media_type}, 'images/{digest}.png'),
    ],
)
def test_static_url_keys(options: dict[str, Any], key: str) -> None:
    uri = media_uri_for(b'x')
    resolve = make_static_public_url('https://cdn.example/', **options)
    expected = 'https://cdn.example/' + key.format(digest=uri.removeprefix('media+sha256://'))
    assert resolve(uri, PNG) == expected


@pytest.mark.parametrize(
    ('arguments', 'options', 'error'),
    [
        (('https://cdn.example',), {'extension': '.png', 'key_strategy': by_media_type}, ValueError),
        (('https://cdn.example',), {'extension': '/x'}, ValueError),
        (('https://cdn.example',), {'extension': 'a\\b'}, ValueError),
        (('https://cdn.example',), {'extension': 3}, TypeError),
        (('https://cdn.example',), {'key_prefix': None}, TypeError),
        (('https://cdn.example',), {'key_strategy': 'images/'}, TypeError),
        ((b'https://cdn.example',), {}, TypeError),
    ],
)
def test_static_url_arguments_are_checked(
    arguments: tuple[Any, ...], options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        make_static_public_url(*arguments, **options)


async def test_mongo_media_store_collection_and_chunk_size(mongo_database: tuple[Any, str]) -> None:
    client, database = mongo_database
    data = bytes(range(10))
    async with MongoMediaStore(client=client, database=database, collection='blobs', chunk_size_bytes=4) as store:
        uri = await store.put(data)
        assert await store.get(uri) == data
    names = set(await client[database].list_collection_names())
    assert {'blobs', 'blobs_chunks'} <= names and not names & {'media', 'media_chunks'}
    manifest = await client[database]['blobs'].find_one({'_id': uri.removeprefix('media+sha256://')})
    assert (manifest['chunk_size'], manifest['chunks']) == (4, 3)
    assert await client[database]['blobs_chunks'].count_documents({'files_id': manifest['files_id']}) == 3


async def test_mongo_media_store_defaults_and_db_url(mongo_server: MongoServer) -> None:
    """`MongoMediaStore(db_url=..., database=...)`: collection `media`, chunks of 8 MiB, a client of its own."""
    async with mongo_server.scratch() as scratch:
        database = scratch.fresh_database()
        async with MongoMediaStore(db_url=mongo_server.uri, database=database) as store:
            assert store.chunk_size_bytes == DEFAULT_CHUNK_SIZE_BYTES == 8 * 1024 * 1024
            uri = await store.put(b'defaults')
        manifest = await scratch.client[database]['media'].find_one({'_id': uri.removeprefix('media+sha256://')})
        assert manifest is not None and manifest['chunk_size'] == 8 * 1024 * 1024
