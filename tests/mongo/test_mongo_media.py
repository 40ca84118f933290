"""MongoMediaStore specifics: chunking beyond 16 MiB, write order, damaged and interrupted blobs, reusing blobs."""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, UserPromptPart

from step_persistence import ContinuableSnapshot, MongoStepStore, RunRecord
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


# --- a damaged blob is never reused (issue 16, item 5) ---


def flip_one_byte(data: bytes) -> bytes:
    return bytes([data[0] ^ 0x01]) + data[1:]


async def chunk_documents(scratch: Scratch, database: str) -> list[dict[str, Any]]:
    return (
        await scratch.client[database]['media_chunks']
        .find({}, {'_id': 0})
        .sort([('files_id', 1), ('n', 1)])
        .to_list(None)
    )


@pytest.mark.parametrize(
    ('collection', 'change'),
    [
        ('media_chunks', 'flip a byte'),
        ('media_chunks', 'remove a chunk'),
        ('media_chunks', 'truncate a chunk'),
        ('media', {'$set': {'chunks': 'three'}}),
        ('media', {'$set': {'chunks': 1}}),
        ('media', {'$unset': {'files_id': ''}}),
        ('media', {'$set': {'files_id': {'$ne': None}}}),
        ('media', {'$set': {'digest': '0' * 64}}),
    ],
    ids=str,
)
async def test_a_damaged_blob_is_not_touched_and_a_put_writes_it_again(
    scratch: Scratch, collection: str, change: Any, caplog: pytest.LogCaptureFixture
) -> None:
    database = scratch.fresh_database()
    store = media_in(scratch, database, chunk_size_bytes=4)
    data = b'twelve bytes and some more'
    uri = await store.put(data, context=MediaContext(media_type='text/plain', metadata={'first': 'put'}))
    chunks = scratch.client[database]['media_chunks']
    if change == 'flip a byte':
        chunk = await chunks.find_one({'n': 1})
        await chunks.update_one({'_id': chunk['_id']}, {'$set': {'data': flip_one_byte(chunk['data'])}})
    elif change == 'remove a chunk':
        await chunks.delete_one({'n': 2})
    elif change == 'truncate a chunk':
        await chunks.update_one({'n': 6}, {'$set': {'data': b''}})
    else:
        await scratch.client[database][collection].update_one({'_id': uri[-64:]}, change)

    with caplog.at_level(logging.WARNING, logger='step_persistence'):
        assert await store.touch(uri) is False
    assert any('is damaged' in record.getMessage() for record in caplog.records)
    assert await store.put(data, context=MediaContext(metadata={'second': 'put'})) == uri
    assert await store.get(uri) == data
    assert await store.touch(uri) is True
    assert dict(await store.get_metadata(uri)) == {'first': 'put'}  # the manifest keeps its metadata
    [manifest] = await scratch.client[database]['media'].find({}).to_list(None)
    stored = [chunk for chunk in await chunk_documents(scratch, database) if chunk['files_id'] == manifest['files_id']]
    assert b''.join(chunk['data'] for chunk in stored) == data
    if 'files_id' not in str(change):  # the damaged chunks are gone (unless the manifest lost track of them)
        assert len(await chunk_documents(scratch, database)) == len(stored)


async def test_a_healthy_blob_is_read_back_when_reused_and_never_written_again(
    mongo_server: MongoServer, scratch: Scratch
) -> None:
    log = CommandLog()
    client = log.client(mongo_server.uri)
    try:
        store = MongoMediaStore(client=client, database=scratch.fresh_database(), chunk_size_bytes=4)
        uri = await store.put(b'twelve bytes')
        log.commands.clear()
        assert await store.touch(uri) is True
        assert await store.put(b'twelve bytes') == uri
        assert [command for command, _, _ in log.commands] == ['findAndModify', 'find'] * 2
    finally:
        await client.close()


async def test_a_step_store_saving_a_payload_whose_blob_is_damaged_stores_it_again(scratch: Scratch) -> None:
    database = scratch.fresh_database()
    image = BinaryContent(data=os.urandom(100_000), media_type='image/png')
    history = [ModelRequest(parts=[UserPromptPart(content=['look', image])])]
    async with MongoStepStore(client=scratch.client, database=database) as first:
        await first.register_run(RunRecord(run_id='first'))
        await first.save_snapshot(ContinuableSnapshot(run_id='first', step_index=1, messages=history))
    chunk = await scratch.client[database]['media_chunks'].find_one({})
    await scratch.client[database]['media_chunks'].update_one(
        {'_id': chunk['_id']}, {'$set': {'data': flip_one_byte(chunk['data'])}}
    )
    async with MongoStepStore(client=scratch.client, database=database) as second:  # another process, say
        assert await second.latest_snapshot(run_id='first') is None  # unreadable: skipped and logged
        await second.register_run(RunRecord(run_id='second'))
        await second.save_snapshot(ContinuableSnapshot(run_id='second', step_index=1, messages=history))
        for run_id in ('second', 'first'):  # the blob is whole again, for the run that damaged it too
            latest = await second.latest_snapshot(run_id=run_id)
            assert latest is not None
            assert latest.messages[0].parts[0].content[1].data == image.data  # type: ignore[union-attr,index]
