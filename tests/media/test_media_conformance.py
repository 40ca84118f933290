"""The media conformance suite: one set of tests, run against every registered media store."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import anyio
import pytest

from step_persistence.media import (
    MediaContext,
    MediaStore,
    default_key_strategy,
    externalize_media,
    make_static_public_url,
    media_uri_for,
    parse_media_uri,
    restore_media,
)
from support.media_backends import MediaBackend, MediaSession

pytestmark = pytest.mark.anyio

ALL_BYTES = bytes(range(256)) * 3
PORTABLE_METADATA = {'author': 'Zoë ✓ — 東京', 'note': '  spaces, 100% sure, "quotes"\ttab  ', 'empty': ''}
"""Metadata every store must give back exactly: keys S3 accepts, values with any text."""


def by_media_type(uri: str, context: MediaContext) -> str:
    """A key strategy that files blobs by media type, e.g. `image/png/<sha256>.bin`."""
    return f'{context.media_type or "unknown/unknown"}/{uri.removeprefix("media+sha256://")}.bin'


class TestMediaStore:
    @pytest.fixture(autouse=True)
    def _declared_divergence(self, request: pytest.FixtureRequest, media_backend: MediaBackend) -> None:
        reason = media_backend.divergences.get(request.node.originalname)
        if reason is not None:
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))

    @pytest.fixture
    def store(self, media_session: MediaSession) -> MediaStore:
        return media_session.make()

    async def test_is_a_media_store(self, store: MediaStore) -> None:
        assert isinstance(store, MediaStore)

    async def test_put_returns_the_content_address_and_get_gives_the_bytes_back(self, store: MediaStore) -> None:
        uri = await store.put(ALL_BYTES)
        assert uri == media_uri_for(ALL_BYTES)
        assert parse_media_uri(uri) == hashlib.sha256(ALL_BYTES).hexdigest()
        assert await store.get(uri) == ALL_BYTES

    async def test_empty_and_large_blobs(self, store: MediaStore) -> None:
        large = bytes(range(256)) * 8192
        for data in (b'', large):
            uri = await store.put(data)
            assert await store.get(uri) == data

    async def test_exists(self, store: MediaStore) -> None:
        uri = media_uri_for(b'not yet')
        assert await store.exists(uri) is False
        await store.put(b'not yet')
        assert await store.exists(uri) is True

    async def test_missing_blob_raises_file_not_found(self, store: MediaStore) -> None:
        uri = media_uri_for(b'never stored')
        with pytest.raises(FileNotFoundError):
            await store.get(uri)
        with pytest.raises(FileNotFoundError):
            await store.get_metadata(uri)

    @pytest.mark.parametrize(
        'uri',
        [
            'media+sha256://' + 'A' * 64,
            'media+sha256://' + 'a' * 63,
            'sha256://' + 'a' * 64,
            'media+sha256://' + 'a' * 64 + '/',
            'media+sha256://../' + 'a' * 61,
        ],
    )
    async def test_malformed_uri_is_a_value_error(self, store: MediaStore, uri: str) -> None:
        with pytest.raises(ValueError, match='not a media URI'):
            await store.get(uri)
        with pytest.raises(ValueError, match='not a media URI'):
            await store.exists(uri)
        with pytest.raises(ValueError, match='not a media URI'):
            await store.get_metadata(uri)
        with pytest.raises(ValueError, match='not a media URI'):
            await store.public_url(uri)

    async def test_metadata_round_trips(self, store: MediaStore) -> None:
        context = MediaContext(media_type='image/png', filename='Zoë photo.png', metadata=PORTABLE_METADATA)
        uri = await store.put(b'with metadata', context=context)
        assert dict(await store.get_metadata(uri, context=context)) == PORTABLE_METADATA

    async def test_no_metadata_gives_an_empty_mapping(self, store: MediaStore) -> None:
        uri = await store.put(b'plain')
        metadata: Mapping[str, str] = await store.get_metadata(uri)
        assert dict(metadata) == {}

    async def test_putting_stored_bytes_again_keeps_the_first_metadata(self, store: MediaStore) -> None:
        first = MediaContext(metadata={'version': 'first'})
        uri = await store.put(b'same bytes', context=first)
        assert await store.put(b'same bytes', context=MediaContext(metadata={'version': 'second'})) == uri
        assert dict(await store.get_metadata(uri)) == {'version': 'first'}
        assert await store.get(uri) == b'same bytes'

    async def test_corrupted_blob_is_a_value_error_on_read(
        self, media_session: MediaSession, store: MediaStore
    ) -> None:
        uri = await store.put(b'original bytes')
        await media_session.corrupt(store, uri, MediaContext(), b'tampered bytes')
        with pytest.raises(ValueError, match='corrupt'):
            await store.get(uri)

    async def test_concurrent_puts(self, store: MediaStore) -> None:
        blobs = [f'blob {n % 5}'.encode() for n in range(20)]
        uris: list[str] = []

        async def put(data: bytes) -> None:
            uris.append(await store.put(data))

        async with anyio.create_task_group() as group:
            for data in blobs:
                group.start_soon(put, data)
        assert sorted(uris) == sorted(media_uri_for(data) for data in blobs)
        for data in set(blobs):
            assert await store.get(media_uri_for(data)) == data

    async def test_public_url_is_none_without_a_resolver(self, store: MediaStore) -> None:
        uri = await store.put(b'private')
        assert await store.public_url(uri) is None

    async def test_public_url_from_a_sync_or_async_resolver(self, media_session: MediaSession) -> None:
        def sync_resolver(uri: str, context: MediaContext) -> str:
            return f'https://sync.example/{parse_media_uri(uri)}?type={context.media_type}'

        async def async_resolver(uri: str, context: MediaContext) -> str | None:
            await anyio.lowlevel.checkpoint()
            return None if context.media_type == 'secret' else f'https://async.example/{parse_media_uri(uri)}'

        uri = media_uri_for(b'public')
        context = MediaContext(media_type='image/png')
        sync_store = media_session.make(public_url=sync_resolver)
        assert await sync_store.public_url(uri, context=context) == f'https://sync.example/{uri[-64:]}?type=image/png'
        async_store = media_session.make(public_url=async_resolver)
        assert await async_store.public_url(uri, context=context) == f'https://async.example/{uri[-64:]}'
        assert await async_store.public_url(uri, context=MediaContext(media_type='secret')) is None

    async def test_static_public_url(self, media_session: MediaSession) -> None:
        store = media_session.make(public_url=make_static_public_url('https://cdn.example/media/', 'blobs/'))
        uri = media_uri_for(b'static')
        assert await store.public_url(uri) == f'https://cdn.example/media/blobs/{uri[-64:]}.bin'

    async def test_custom_key_strategy(self, media_session: MediaSession) -> None:
        store = media_session.make(key_strategy=by_media_type)
        png, pdf = MediaContext(media_type='image/png'), MediaContext(media_type='application/pdf')
        uri = await store.put(b'typed', context=png)
        assert await store.exists(uri, context=png) is True
        assert await store.exists(uri, context=pdf) is False
        assert await store.get(uri, context=png) == b'typed'
        assert await media_session.make(key_strategy=default_key_strategy).exists(uri) is False

    @pytest.mark.parametrize('key', ['/etc/passwd', '../outside.bin', 'a/../../outside.bin', 'a//b', '', 'C:\\x'])
    async def test_unsafe_keys_are_rejected(self, media_session: MediaSession, key: str) -> None:
        store = media_session.make(key_strategy=lambda uri, context: key)
        with pytest.raises(ValueError, match='key strategy'):
            await store.put(b'escape attempt')
        with pytest.raises(ValueError, match='key strategy'):
            await store.get(media_uri_for(b'escape attempt'))

    async def test_walker_round_trip_through_the_store(self, store: MediaStore) -> None:
        tree = {
            'parts': [
                {'content': 'é' * 40_000, 'part_kind': 'text'},
                {'data': 'AAEC_w==', 'media_type': 'image/png', 'kind': 'binary'},
            ]
        }
        stored = await externalize_media(tree, media_store=store)
        assert stored != tree
        assert await restore_media(stored, media_store=store) == tree
        assert await store.get(media_uri_for(b'\x00\x01\x02\xff')) == b'\x00\x01\x02\xff'
