"""Listing, touching and deleting blobs: the `CollectableMediaStore` side of every media store."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from test_media_conformance import PORTABLE_METADATA, by_media_type

from step_persistence.media import (
    REUSE_WINDOW,
    CollectableMediaStore,
    DiskMediaStore,
    MediaContext,
    StoredBlob,
    externalize_media,
    media_uri_for,
)
from step_persistence.media.clock import advanced_media_clock, media_now
from support.media_backends import MediaBackend, MediaSession

pytestmark = pytest.mark.anyio

SQL_KEYS = 'SQL rows are addressed by the digest: the SQL media store takes no key strategy'
SERVER_CLOCK = 'S3 stamps objects with the server clock (LastModified), which the test clock cannot move'


class TestCollectableMediaStore:
    @pytest.fixture(autouse=True)
    def _declared_divergence(self, request: pytest.FixtureRequest, media_backend: MediaBackend) -> None:
        sql = {'test_blobs_under_a_key_strategy_are_listed_and_deleted': SQL_KEYS}
        s3 = {'test_touch_and_put_refresh_the_touched_time': SERVER_CLOCK}
        divergences = {'s3': s3, 'sqlite': sql, 'postgres': sql}
        reason = divergences.get(media_backend.name, {}).get(request.node.originalname)
        if reason is not None:
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))

    @pytest.fixture
    def store(self, media_session: MediaSession) -> CollectableMediaStore:
        store = media_session.make()
        assert isinstance(store, CollectableMediaStore)
        return store

    @staticmethod
    async def _listed(store: CollectableMediaStore) -> dict[str, StoredBlob]:
        return {blob.uri: blob async for blob in store.list_blobs()}

    async def test_list_blobs_lists_what_was_put_with_its_touched_time(self, store: CollectableMediaStore) -> None:
        before = media_now() - timedelta(minutes=1)
        uris = {await store.put(b'one'), await store.put(b'two', context=MediaContext(media_type='text/plain'))}
        listed = await self._listed(store)
        assert set(listed) == uris
        for blob in listed.values():
            assert blob.touched_at.utcoffset() == timedelta(0)
            assert before <= blob.touched_at <= media_now() + timedelta(minutes=1)

    async def test_touch_says_whether_the_blob_is_stored(self, store: CollectableMediaStore) -> None:
        assert await store.touch(media_uri_for(b'absent')) is False
        uri = await store.put(b'present', context=MediaContext(metadata=PORTABLE_METADATA, media_type='image/png'))
        assert await store.touch(uri) is True
        assert await store.get(uri) == b'present'
        assert await store.get_metadata(uri) == PORTABLE_METADATA

    async def test_touch_and_put_refresh_the_touched_time(self, store: CollectableMediaStore) -> None:
        uri = await store.put(b'aging')
        first = (await self._listed(store))[uri].touched_at
        with advanced_media_clock(timedelta(hours=1)):
            assert await store.touch(uri) is True
            touched = (await self._listed(store))[uri].touched_at
        with advanced_media_clock(timedelta(hours=2)):
            await store.put(b'aging')
            put_again = (await self._listed(store))[uri].touched_at
        assert touched - first > timedelta(minutes=50)
        assert put_again - touched > timedelta(minutes=50)

    async def test_delete_blob(self, store: CollectableMediaStore) -> None:
        keep = await store.put(b'keep')
        uri = await store.put(b'doomed', context=MediaContext(metadata={'a': 'b'}))
        blob = (await self._listed(store))[uri]
        assert await store.delete_blob(blob) is True
        assert set(await self._listed(store)) == {keep}
        assert await store.exists(uri) is False
        with pytest.raises(FileNotFoundError):
            await store.get(uri)
        assert await store.delete_blob(blob) is False
        assert await store.put(b'doomed') == uri  # stored again from scratch
        assert await store.get(uri) == b'doomed'

    async def test_delete_blob_keeps_a_blob_touched_since(self, store: CollectableMediaStore) -> None:
        uri = await store.put(b'touched')
        blob = (await self._listed(store))[uri]
        assert await store.delete_blob(blob, touched_before=blob.touched_at - timedelta(seconds=1)) is False
        assert await store.get(uri) == b'touched'
        assert await store.delete_blob(blob, touched_before=media_now() + timedelta(seconds=2)) is True
        assert await store.exists(uri) is False

    async def test_blobs_under_a_key_strategy_are_listed_and_deleted(self, media_session: MediaSession) -> None:
        store = media_session.make(key_strategy=by_media_type)
        assert isinstance(store, CollectableMediaStore)
        png = MediaContext(media_type='image/png')
        uri = await store.put(b'typed', context=png)
        listed = await self._listed(store)
        assert set(listed) == {uri}
        assert await store.delete_blob(listed[uri]) is True
        assert await store.exists(uri, context=png) is False


class RememberedDiskMediaStore(DiskMediaStore):
    """A disk store as the walker treats a remote one: blobs it stored or touched are remembered for a while."""

    put_checks_stored_copy = False
    remember_reuse = True


async def test_the_walker_touches_a_remembered_blob_again_after_the_reuse_window(tmp_path: Path) -> None:
    store = RememberedDiskMediaStore(tmp_path / 'media')
    tree = {'kind': 'binary', 'data': 'AAEC_w==', 'media_type': 'image/png'}
    await externalize_media(tree, media_store=store)
    path = store.path_for(media_uri_for(b'\x00\x01\x02\xff'), context=MediaContext(media_type='image/png'))
    path.unlink()
    await externalize_media(tree, media_store=store)
    assert not path.exists(), 'within the reuse window the walker relies on what it stored'
    with advanced_media_clock(REUSE_WINDOW + timedelta(seconds=1)):
        await externalize_media(tree, media_store=store)
    assert path.exists(), 'after it, the walker touches the blob, finds it gone and stores it again'


async def test_the_walker_checks_a_disk_blob_at_every_reuse(tmp_path: Path) -> None:
    """A `DiskMediaStore` is not remembered: checking a blob again is a local `stat` (issue 16, item 5)."""
    store = DiskMediaStore(tmp_path / 'media')
    tree = {'kind': 'binary', 'data': 'AAEC_w==', 'media_type': 'image/png'}
    await externalize_media(tree, media_store=store)
    path = store.path_for(media_uri_for(b'\x00\x01\x02\xff'), context=MediaContext(media_type='image/png'))
    path.unlink()
    await externalize_media(tree, media_store=store)
    assert path.exists()
