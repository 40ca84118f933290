"""What is particular to `S3MediaStore`, against the session's real nanio server (SigV4 checked)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio.to_thread
import httpx2
import pytest

from step_persistence.media import MediaContext, S3MediaStore, media_uri_for
from step_persistence.media.s3 import S3Error
from support.flaky_proxy import flaky_proxy
from support.servers.s3 import S3Server

pytestmark = pytest.mark.anyio


def make_store(server: S3Server, **options: Any) -> S3MediaStore:
    arguments: dict[str, Any] = {
        'bucket': server.bucket,
        'endpoint': server.endpoint,
        'region': server.region,
        'access_key_id': server.access_key_id,
        'secret_access_key': server.secret_access_key,
        'key_prefix': f's3-tests-{uuid.uuid4().hex}/',
        **options,
    }
    return S3MediaStore(**arguments)


@pytest.fixture
async def store(s3_server: S3Server) -> AsyncIterator[S3MediaStore]:
    async with make_store(s3_server) as store:
        yield store


def upstream_port(server: S3Server) -> int:
    port = urlsplit(server.endpoint).port
    assert port is not None
    return port


async def test_objects_carry_content_type_disposition_and_metadata_headers(
    s3_server: S3Server, store: S3MediaStore
) -> None:
    context = MediaContext(media_type='image/png', filename='été 1.png', metadata={'run-id': 'r-1', 'note': 'ça va'})
    uri = await store.put(b'png bytes', context=context)
    key = store.key_for(uri, context=context)
    assert key == f'{store.key_prefix}{uri[-64:]}.bin'
    response = await anyio.to_thread.run_sync(s3_server.request, 'HEAD', f'/{s3_server.bucket}/{key}')
    assert response.status_code == 200
    assert response.headers['content-type'] == 'image/png'
    assert response.headers['content-disposition'] == "inline; filename*=UTF-8''%C3%A9t%C3%A9%201.png"
    assert response.headers['x-amz-meta-run-id'] == 'r-1'
    assert response.headers['x-amz-meta-note'] == '%C3%A7a%20va'
    assert dict(await store.get_metadata(uri, context=context)) == {'run-id': 'r-1', 'note': 'ça va'}


async def test_without_media_type_objects_are_octet_streams(s3_server: S3Server, store: S3MediaStore) -> None:
    uri = await store.put(b'untyped')
    key = store.key_for(uri)
    response = await anyio.to_thread.run_sync(s3_server.request, 'HEAD', f'/{s3_server.bucket}/{key}')
    assert response.headers['content-type'] == 'application/octet-stream'


@pytest.mark.parametrize('key', ['Upper', 'with space', 'ünïcode', '-leading-dash', ''])
async def test_metadata_keys_s3_cannot_give_back_are_rejected_before_sending(store: S3MediaStore, key: str) -> None:
    with pytest.raises(ValueError, match='S3 metadata key'):
        await store.put(b'data', context=MediaContext(metadata={key: 'value'}))
    assert await store.exists(media_uri_for(b'data')) is False


async def test_wrong_secret_key_is_rejected_with_a_clear_error(s3_server: S3Server) -> None:
    async with make_store(s3_server, secret_access_key='not-the-secret') as store:
        with pytest.raises(S3Error, match='HTTP 403') as on_put:
            await store.put(b'unauthorised')
        with pytest.raises(S3Error, match='HTTP 403 SignatureDoesNotMatch') as on_get:
            await store.get(media_uri_for(b'unauthorised'))
    assert on_put.value.status == on_get.value.status == 403
    assert on_get.value.code == 'SignatureDoesNotMatch'
    assert 'secret access key' in str(on_put.value)


async def test_unknown_access_key_is_rejected(s3_server: S3Server) -> None:
    async with make_store(s3_server, access_key_id='nobody') as store:
        with pytest.raises(S3Error, match='403 InvalidAccessKeyId'):
            await store.get(media_uri_for(b'anything'))


async def test_missing_bucket_is_an_error_not_a_missing_blob(s3_server: S3Server) -> None:
    async with make_store(s3_server, bucket='no-such-bucket') as store:
        with pytest.raises(S3Error, match='404 NoSuchBucket'):
            await store.get(media_uri_for(b'anything'))


async def test_keys_with_characters_that_need_encoding(s3_server: S3Server) -> None:
    def strategy(uri: str, context: MediaContext) -> str:
        return f'été 2026/a+b $ (1)~/{context.filename}/{uri.removeprefix("media+sha256://")}'

    context = MediaContext(filename='photo #1?.png')
    async with make_store(s3_server, key_strategy=strategy) as store:
        uri = await store.put(b'encoded key', context=context)
        assert await store.get(uri, context=context) == b'encoded key'
        assert await store.exists(uri) is False


@pytest.mark.parametrize('mode', ['503', 'drop'])
async def test_transient_failures_are_retried(s3_server: S3Server, mode: Literal['503', 'drop']) -> None:
    async with flaky_proxy(upstream_port(s3_server), failures=2, mode=mode) as proxy:
        async with make_store(s3_server, endpoint=proxy.endpoint, backoff_seconds=0.01) as store:
            uri = await store.put(b'survives two failures')
            assert proxy.served == 2
            assert await store.get(uri) == b'survives two failures'
        assert proxy.forwarded >= 1


async def test_retries_give_up_after_max_attempts(s3_server: S3Server) -> None:
    async with flaky_proxy(upstream_port(s3_server), failures=100) as proxy:
        store = make_store(s3_server, endpoint=proxy.endpoint, max_attempts=3, backoff_seconds=0.01)
        async with store:
            with pytest.raises(S3Error, match='HTTP 503') as caught:
                await store.exists(media_uri_for(b'never reachable'))
    assert caught.value.status == 503
    assert proxy.served == 3


async def test_connection_refused_is_retried_then_reported(s3_server: S3Server) -> None:
    async with flaky_proxy(upstream_port(s3_server), failures=0) as proxy:
        closed_endpoint = proxy.endpoint
    async with make_store(s3_server, endpoint=closed_endpoint, max_attempts=2, backoff_seconds=0.01) as store:
        with pytest.raises(S3Error, match='failed after 2 attempts'):
            await store.get(media_uri_for(b'nothing listens'))


async def test_a_client_passed_in_is_used_and_left_open(s3_server: S3Server) -> None:
    seen: list[str] = []

    async def record(request: httpx2.Request) -> None:
        seen.append(request.method)

    async with httpx2.AsyncClient(event_hooks={'request': [record]}) as client:
        async with make_store(s3_server, client=client) as store:
            uri = await store.put(b'through my client')
            assert await store.get(uri) == b'through my client'
        assert not client.is_closed
        assert seen == ['HEAD', 'PUT', 'GET']


async def test_a_store_closes_the_client_it_created(s3_server: S3Server) -> None:
    store = make_store(s3_server)
    await store.aclose()
    with pytest.raises(RuntimeError, match='closed'):
        await store.exists(media_uri_for(b'after close'))


@pytest.mark.parametrize(
    ('option', 'value'),
    [('endpoint', 'ftp://x'), ('endpoint', 'http://x/?q=1'), ('bucket', 'a/b'), ('key_prefix', '/abs/')],
)
def test_bad_configuration_is_a_value_error(s3_server: S3Server, option: str, value: str) -> None:
    with pytest.raises(ValueError, match=option.split('_')[0]):
        make_store(s3_server, **{option: value})


def test_missing_http_client_names_the_extra(monkeypatch: pytest.MonkeyPatch, s3_server: S3Server) -> None:
    monkeypatch.setitem(sys.modules, 'httpx2', None)
    with pytest.raises(ImportError, match=r'step-persistence\[s3\]'):
        make_store(s3_server)
