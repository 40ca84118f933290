"""S3MediaStore refuses what S3 would refuse later, with a clear `ValueError` and nothing sent (issue 16, item 10).

A key prefix with `.`/`..`/empty segments, a bucket that is not a bucket name, or an endpoint
with credentials in it used to be accepted and to fail at the first request with a misleading
403 or 400 (or to send the credentials as the Host header); a media type that cannot be an HTTP
header value raised a bare `UnicodeEncodeError` or was retried before failing.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from step_persistence.media import MediaContext, S3MediaStore, media_uri_for
from support.servers.s3 import S3Server

pytestmark = pytest.mark.anyio


def make_store(server: S3Server, **options: Any) -> S3MediaStore:
    arguments: dict[str, Any] = {
        'bucket': server.bucket,
        'endpoint': server.endpoint,
        'region': server.region,
        'access_key_id': server.access_key_id,
        'secret_access_key': server.secret_access_key,
        'key_prefix': f's3-validation-{uuid.uuid4().hex}/',
        **options,
    }
    return S3MediaStore(**arguments)


@pytest.mark.parametrize(
    'key_prefix',
    ['a/../b/', '../', 'a/./', './', 'x//', 'a//b/', '..', '.', 'a/\x00/', 'a\r\n/', 'a\\b/', '\ud800/', 'k' * 901],
    ids=repr,
)
def test_a_key_prefix_s3_would_not_keep_as_written_is_refused(s3_server: S3Server, key_prefix: str) -> None:
    with pytest.raises(ValueError, match='key_prefix'):
        make_store(s3_server, key_prefix=key_prefix)


@pytest.mark.parametrize('key_prefix', ['', 'media/', 'media-', 'tenant/a/', 'été/', 'a.b/c_d-e/'])
async def test_ordinary_key_prefixes_work(s3_server: S3Server, key_prefix: str) -> None:
    unique = f'{uuid.uuid4().hex}/{key_prefix}'
    async with make_store(s3_server, key_prefix=unique) as store:
        uri = await store.put(b'prefixed bytes')
        assert await store.get(uri) == b'prefixed bytes'
        assert [blob.uri async for blob in store.list_blobs()] == [uri]


@pytest.mark.parametrize(
    'bucket', ['..', '.', '', 'a', 'a/b', '-bucket', 'bucket-', 'a..b', 'b\r\nx', 'bücket', 'b' * 256], ids=repr
)
def test_a_bucket_that_is_not_a_bucket_name_is_refused(s3_server: S3Server, bucket: str) -> None:
    with pytest.raises(ValueError, match='bucket'):
        make_store(s3_server, bucket=bucket)


def test_an_endpoint_with_credentials_is_refused_without_echoing_them(s3_server: S3Server) -> None:
    host = s3_server.endpoint.split('://', 1)[1]
    with pytest.raises(ValueError, match='endpoint') as raised:
        make_store(s3_server, endpoint=f'http://admin:S3cretInUrl@{host}')
    assert 'S3cretInUrl' not in str(raised.value)


@pytest.mark.parametrize(
    'endpoint',
    ['http://h\u00e9st:9000', 'http://host:99999', 'http://host:port', 'http://host/a/../b', 'http:// x'],
    ids=repr,
)
def test_an_endpoint_that_cannot_be_a_host_header_is_refused(s3_server: S3Server, endpoint: str) -> None:
    with pytest.raises(ValueError, match='endpoint'):
        make_store(s3_server, endpoint=endpoint)


@pytest.mark.parametrize(
    ('option', 'value'),
    [
        ('region', 'us-east-1\r\nx-injected: 1'),
        ('region', 'régïon'),
        ('region', ''),
        ('access_key_id', 'AK ID'),
        ('access_key_id', 'AK/ID'),
        ('access_key_id', 'ÄKID'),
        ('session_token', 'SeCrEt\r\nT0ken'),
    ],
)
def test_credentials_and_region_that_cannot_be_sent_are_refused(s3_server: S3Server, option: str, value: str) -> None:
    with pytest.raises(ValueError, match=option) as raised:
        make_store(s3_server, **{option: value})
    if option == 'session_token':
        assert 'SeCrEt' not in str(raised.value)


@pytest.mark.parametrize(
    'media_type', ['image/pngé', 'image/png\r\nx-amz-acl: public-read', 'a\x00b', 'text/\x7f'], ids=repr
)
async def test_a_media_type_that_cannot_be_a_header_is_a_value_error_before_any_request(
    s3_server: S3Server, media_type: str
) -> None:
    sent: list[str] = []
    async with make_store(s3_server, max_attempts=3) as store:
        original = store._client.request

        async def counting(method: str, url: str, **options: Any) -> Any:
            sent.append(method)
            return await original(method, url, **options)

        store._client.request = counting  # type: ignore[method-assign]
        with pytest.raises(ValueError, match='media_type'):
            await store.put(b'typed bytes', context=MediaContext(media_type=media_type))
        assert sent == []
        assert not await store.exists(media_uri_for(b'typed bytes'))
