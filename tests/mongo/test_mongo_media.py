"""MongoMediaStore specifics: chunking beyond 16 MiB, write order, damaged and interrupted blobs."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest

from step_persistence.media import MediaContext, media_uri_for
from step_persistence.stores.mongo.media_store import MAX_CHUNK_SIZE_BYTES, MongoMediaStore
from support.mongo_helpers import CommandLog, scratch
from support.servers.mongo import MongoServer, Scratch

__all__ = ['scratch']

pytestmark = pytest.mark.anyio
MIB = 1024 * 1024
UNUSED_URL = 'mongodb://127.0.0.1:1/'


def media_in(scratch: Scratch, database: str, **options: Any) -> MongoMediaStore:
    return MongoMediaStore(client=scratch.client, database=database, **options)


async def test_a_40_mb_blob_is_stored_in_chunks_and_read_back(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    data = os.urandom(40 * 1000 * 1000)
    store = media_in(scratch, database)
    uri = await store.put(data, context=MediaContext(media_type='video/mp4', metadata={'a.b': '$c'}))
    assert await store.get(uri) == data
    assert dict(await store.get_metadata(uri)) == {'a.b': '$c'}
    digest = hashlib.sha256(data).hexdigest()
    manifest = await scratch.client[database]['media'].find_one({'_id': digest})
    assert (manifest['size'], manifest['chunks'], manifest['media_type']) == (len(data), 5, 'video/mp4')
    sizes = [
        len(chunk['data'])
        async for chunk in scratch.client[database]['media_chunks'].find({'files_id': manifest['files_id']})
    ]
    assert sorted(sizes) == [len(data) - 4 * 8 * MIB, *[8 * MIB] * 4]


async def test_chunks_go_before_the_manifest_and_only_once(mongo_server: MongoServer, scratch: Scratch) -> None:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    try:
        store = MongoMediaStore(client=client, database=scratch.fresh_database(), chunk_size_bytes=4)
        uri = await store.put(b'twelve bytes')
        assert log.named('insert') == ['media_chunks', 'media']
        assert await store.put(b'twelve bytes', context=MediaContext(metadata={'ignored': 'yes'})) == uri
        assert log.named('insert') == ['media_chunks', 'media']
        assert dict(await store.get_metadata(uri)) == {}
    finally:
        await client.close()


async def test_an_interrupted_put_is_invisible_and_completed_by_the_next_one(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = media_in(scratch, database, chunk_size_bytes=4)
    uri = await store.put(b'interrupted put')
    await scratch.client[database]['media'].delete_many({})
    await scratch.client[database]['media_chunks'].delete_one({'n': 2})
    assert await store.exists(uri) is False
    with pytest.raises(FileNotFoundError):
        await store.get(uri)
    assert await store.put(b'interrupted put') == uri
    assert await store.get(uri) == b'interrupted put'


async def test_stores_with_different_chunk_sizes_never_mix_chunks(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    fours, threes = media_in(scratch, database, chunk_size_bytes=4), media_in(scratch, database, chunk_size_bytes=3)
    uri = await fours.put(b'shared content')
    await scratch.client[database]['media'].delete_many({})
    await threes.put(b'shared content')
    assert await fours.get(uri) == await threes.get(uri) == b'shared content'


async def test_damaged_blobs_are_value_errors(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = media_in(scratch, database, chunk_size_bytes=4)
    first, second = await store.put(b'missing a chunk'), await store.put(b'bad metadata')
    manifest = await scratch.client[database]['media'].find_one({'_id': first[-64:]})
    await scratch.client[database]['media_chunks'].delete_one({'files_id': manifest['files_id'], 'n': 1})
    with pytest.raises(ValueError, match='corrupt: chunk 1 is missing'):
        await store.get(first)
    await scratch.client[database]['media'].update_one({'_id': second[-64:]}, {'$set': {'metadata': '[1]'}})
    with pytest.raises(ValueError, match=r'metadata of blob .* is malformed'):
        await store.get_metadata(second)


async def test_custom_collection_names(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    store = media_in(scratch, database, collection='blobs')
    await store.put(b'named')
    assert sorted(await scratch.client[database].list_collection_names()) == ['blobs', 'blobs_chunks']
    assert await media_in(scratch, database).exists(media_uri_for(b'named')) is False


@pytest.mark.parametrize(
    ('options', 'message'),
    [
        ({'db_url': UNUSED_URL, 'chunk_size_bytes': 0}, 'chunk_size_bytes'),
        ({'db_url': UNUSED_URL, 'chunk_size_bytes': MAX_CHUNK_SIZE_BYTES + 1}, 'chunk_size_bytes'),
        ({'db_url': UNUSED_URL, 'chunk_size_bytes': 1.5}, 'chunk_size_bytes'),
        ({'db_url': UNUSED_URL, 'collection': ''}, 'collection'),
        ({}, 'exactly one of client'),
    ],
)
def test_bad_arguments_are_value_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MongoMediaStore(database='db', **options)
