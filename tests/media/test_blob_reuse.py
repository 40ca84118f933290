"""A damaged stored blob never poisons later saves (issue 16, item 5): reusing a blob checks it first.

A save that needs a payload already stored relies on the stored copy instead of writing it again.
If that copy was damaged (a byte flipped on disk, an object overwritten in the bucket), the new
snapshot would point at bytes that can never be read back. The disk and S3 media stores check the
stored copy against the bytes when `put` finds it (the walker calls `put` for them, not `touch`),
and write it again when it differs, which also makes the older snapshots that use it readable
again (the address is the content).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from pydantic_ai.messages import BinaryContent, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart

from step_persistence import ContinuableSnapshot, FileStepStore, RunRecord
from step_persistence.media import DiskMediaStore, MediaContext, S3MediaStore, media_uri_for
from step_persistence.media.walker import externalize_media, restore_media
from step_persistence.testing.conformance import T0
from support.servers.s3 import S3Server

pytestmark = pytest.mark.anyio

IMAGE = bytes(range(256)) * 64
PNG = MediaContext(media_type='image/png')


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def history() -> list[ModelRequest]:
    return [
        ModelRequest(
            parts=[UserPromptPart(content=['look', BinaryContent(IMAGE, media_type='image/png')], timestamp=T0)]
        )
    ]


def dump(messages: Any) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


@pytest.mark.parametrize('saver', ['same-store', 'fresh-store'])
async def test_a_file_store_save_rewrites_a_damaged_blob_it_would_reuse(tmp_path: Path, saver: str) -> None:
    store = FileStepStore(tmp_path, fsync=False)
    await store.register_run(RunRecord(run_id='first'))
    await store.save_snapshot(ContinuableSnapshot(run_id='first', step_index=1, messages=history()))
    [blob] = store.media_directory.glob('*.bin')
    flip_one_byte(blob)
    assert await FileStepStore(tmp_path).latest_snapshot(run_id='first') is None  # damaged: skipped

    writer = store if saver == 'same-store' else FileStepStore(tmp_path, fsync=False)
    await writer.register_run(RunRecord(run_id='second'))
    await writer.save_snapshot(ContinuableSnapshot(run_id='second', step_index=1, messages=history()))
    reader = FileStepStore(tmp_path)
    for run_id in ('second', 'first'):  # the first run's snapshot reads again: same address, bytes repaired
        latest = await reader.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(history())
    assert blob.read_bytes() == IMAGE


@pytest.mark.parametrize('damage', ['flipped-byte', 'truncated', 'a-link'])
async def test_a_disk_put_over_a_damaged_blob_writes_it_again(tmp_path: Path, damage: str) -> None:
    store = DiskMediaStore(tmp_path / 'media')
    uri = await store.put(IMAGE, context=PNG)
    path = store.path_for(uri)
    for putter in (store, DiskMediaStore(tmp_path / 'media')):
        if damage == 'flipped-byte':
            flip_one_byte(path)
        elif damage == 'truncated':
            path.write_bytes(IMAGE[:100])
        else:
            (tmp_path / 'elsewhere').write_bytes(IMAGE)
            path.unlink()
            path.symlink_to(tmp_path / 'elsewhere')
        assert await putter.put(IMAGE, context=PNG) == uri
        assert not path.is_symlink() and path.read_bytes() == IMAGE
        assert await putter.get(uri) == IMAGE
    assert dict(await store.get_metadata(uri)) == {}


async def test_the_walker_checks_a_disk_blob_at_every_reuse(tmp_path: Path) -> None:
    """Not only after its memory of stored blobs expires: a damaged copy is rewritten by the next save."""
    store = DiskMediaStore(tmp_path)
    tree = {'kind': 'binary', 'data': 'AAECAw==', 'media_type': 'image/png'}
    packed = await externalize_media(tree, media_store=store)
    path = store.path_for(media_uri_for(bytes([0, 1, 2, 3])))
    flip_one_byte(path)
    assert await externalize_media(tree, media_store=store) == packed
    assert await restore_media(packed, media_store=store) == tree


async def test_a_blob_found_damaged_on_read_is_checked_again_by_the_next_save(tmp_path: Path) -> None:
    """For a store whose reuse the walker remembers: a failed read makes it forget the blob."""

    class Remembering(DiskMediaStore):
        put_checks_stored_copy = False
        remember_reuse = True

    store = Remembering(tmp_path)
    tree = {'kind': 'binary', 'data': 'AAECAw==', 'media_type': 'image/png'}
    packed = await externalize_media(tree, media_store=store)
    flip_one_byte(store.path_for(media_uri_for(bytes([0, 1, 2, 3]))))
    with pytest.raises(ValueError, match='corrupt'):
        await restore_media(packed, media_store=store)
    store.path_for(media_uri_for(bytes([0, 1, 2, 3]))).unlink()
    await externalize_media(tree, media_store=store)  # forgotten: touched, found missing, put again
    assert await restore_media(packed, media_store=store) == tree


# --- S3 ---


@pytest.fixture
async def s3(s3_server: S3Server) -> AsyncIterator[S3MediaStore]:
    async with S3MediaStore(
        s3_server.bucket,
        s3_server.endpoint,
        s3_server.region,
        s3_server.access_key_id,
        s3_server.secret_access_key,
        key_prefix=f'reuse-{uuid.uuid4().hex}/',
    ) as store:
        yield store


@pytest.mark.parametrize('replacement', [IMAGE[:-1] + b'\x00', IMAGE[:100]], ids=['same-size', 'shorter'])
async def test_an_s3_put_over_an_overwritten_object_writes_it_again(
    s3_server: S3Server, s3: S3MediaStore, replacement: bytes
) -> None:
    uri = await s3.put(IMAGE, context=PNG)
    key = s3.key_for(uri)
    await anyio.to_thread.run_sync(s3_server.put_object, key, replacement)
    with pytest.raises(ValueError, match='corrupt'):
        await s3.get(uri)
    assert await s3.put(IMAGE, context=PNG) == uri
    assert await s3.get(uri) == IMAGE
    response = await anyio.to_thread.run_sync(s3_server.request, 'HEAD', f'/{s3_server.bucket}/{key}')
    assert response.headers['content-type'] == 'image/png'


async def test_an_s3_put_of_an_intact_object_uploads_nothing(s3_server: S3Server, s3: S3MediaStore) -> None:
    uri = await s3.put(IMAGE, context=PNG)
    sent: list[tuple[str, int]] = []
    original = s3._client.request

    async def counting(method: str, url: str, **options: Any) -> Any:
        sent.append((method, len(options.get('content') or b'')))
        return await original(method, url, **options)

    s3._client.request = counting  # type: ignore[method-assign]
    assert await s3.put(IMAGE, context=PNG) == uri
    assert [method for method, _ in sent] == ['HEAD', 'PUT'] and all(size == 0 for _, size in sent)  # HEAD, copy


async def test_the_walker_rewrites_an_overwritten_s3_object(s3_server: S3Server, s3: S3MediaStore) -> None:
    tree = {'kind': 'binary', 'data': 'AAECAw==', 'media_type': 'image/png'}
    packed = await externalize_media(tree, media_store=s3)
    key = s3.key_for(media_uri_for(bytes([0, 1, 2, 3])), context=PNG)
    await anyio.to_thread.run_sync(s3_server.put_object, key, b'\x00\x01\x02\x04')
    with pytest.raises(ValueError, match='corrupt'):
        await restore_media(packed, media_store=s3)
    await externalize_media(tree, media_store=s3)  # the failed read made the walker forget the blob
    assert await restore_media(packed, media_store=s3) == tree
