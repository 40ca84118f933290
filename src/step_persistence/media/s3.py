"""`S3MediaStore`: blobs as objects of an S3-compatible bucket (AWS S3, Cloudflare R2, MinIO, ...).

Requests are path-style (`<endpoint>/<bucket>/<key>`) and signed with SigV4 by `sigv4`; the HTTP
client (`httpx2`, the client pydantic-ai itself uses) is imported only when a store is created,
so `import step_persistence.media` works without the `s3` extra.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote, unquote, urlsplit
from xml.etree import ElementTree

import anyio

from step_persistence._closing import ClosesOnExit
from step_persistence._urls import redact_text, redact_url
from step_persistence.media.keys import blob_key, default_key_strategy, resolve_public_url, uri_of_key
from step_persistence.media.protocol import NO_CONTEXT, KeyStrategy, MediaContext, PublicUrlResolver, StoredBlob
from step_persistence.media.sigv4 import EMPTY_SHA256, Credentials, encode_path, sign
from step_persistence.media.uri import check_digest, media_uri_for, parse_media_uri

if TYPE_CHECKING:
    import httpx2

__all__ = ['S3Error', 'S3MediaStore']

_META_PREFIX = 'x-amz-meta-'
_META_KEY = re.compile(r'[a-z0-9][a-z0-9_-]*')
_META_VALUE_SAFE = ''.join(chr(c) for c in range(0x21, 0x7F) if chr(c) != '%')
"""Printable ASCII but `%` (and space) stays as is in a metadata header value; the rest is percent-encoded."""
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_ERROR_CODE = re.compile(rb'<Code>([^<]{1,100})</Code>')
_COPIED_HEADERS = ('content-type', 'content-disposition', 'content-encoding', 'cache-control')
"""Headers of an object that a touch (a copy onto itself) gives the copy again."""
_BUCKET = re.compile(r'[A-Za-z0-9](?:[A-Za-z0-9._-]{1,253})[A-Za-z0-9]')
"""S3's bucket names, legacy ones (upper case, underscores, up to 255 characters) included."""
_REGION = re.compile(r'[A-Za-z0-9_.-]{1,64}')
_HEADER_TOKEN = re.compile(r'[\x21-\x7e]+')
"""Printable ASCII without spaces: what can go into the `Authorization` and token headers as is."""
_HEADER_VALUE = re.compile(r'[\x20-\x7e]*')
"""Printable ASCII: what an HTTP header value can hold (no CR, LF, NUL or other control characters)."""
_MAX_PREFIX_BYTES = 900
"""S3 keys have at most 1024 UTF-8 bytes; a prefix leaves room for the key strategy's keys."""
_MD5_HEX = re.compile(r'[0-9a-f]{32}')


def _check_key_prefix(key_prefix: object) -> str:
    """`key_prefix` if S3 keeps keys under it exactly as written; `ValueError` otherwise.

    `.` and `..` segments are resolved away by HTTP clients and servers, an empty segment (`x//`) is
    collapsed by some, and control characters or text that is not valid Unicode cannot be sent.
    """
    if not isinstance(key_prefix, str):
        raise ValueError(f'key_prefix must be a string, got {type(key_prefix).__name__}')
    try:
        size = len(key_prefix.encode('utf-8'))
    except UnicodeEncodeError:
        raise ValueError(f'key_prefix must be valid Unicode text, got {key_prefix!r}') from None
    if size > _MAX_PREFIX_BYTES:
        raise ValueError(f'key_prefix must have at most {_MAX_PREFIX_BYTES} UTF-8 bytes, got {size}')
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in key_prefix) or '\\' in key_prefix:
        raise ValueError(f'key_prefix must not contain control characters or backslashes, got {key_prefix!r}')
    if key_prefix.startswith('/'):
        raise ValueError(f'key_prefix must not start with "/", got {key_prefix!r}')
    *directories, last = key_prefix.split('/')
    if any(segment in ('', '.', '..') for segment in directories) or last in ('.', '..'):
        raise ValueError(
            f'key_prefix must not have empty, "." or ".." segments (servers would not keep them), got {key_prefix!r}'
        )
    return key_prefix


def _check_endpoint(endpoint: str) -> tuple[str, str, str]:
    """`(scheme, host header, base path)` of an endpoint URL; `ValueError` (with the URL redacted) otherwise."""
    shown = redact_url(endpoint) if isinstance(endpoint, str) else type(endpoint).__name__
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme not in ('http', 'https') or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f'endpoint must be an http(s) URL without query or fragment, got {shown!r}')
    if '@' in parts.netloc:
        raise ValueError(
            'endpoint must not hold credentials (pass access_key_id and secret_access_key; '
            f'they would be sent as the Host header), got {shown!r}'
        )
    if not _HEADER_TOKEN.fullmatch(parts.netloc) or not parts.hostname:
        raise ValueError(f'endpoint must name an ASCII host (IDNA-encode it), got {shown!r}')
    try:
        parts.port  # noqa: B018  (raises for a port that is not a number from 0 to 65535)
    except ValueError:
        raise ValueError(f'endpoint has an invalid port: {shown!r}') from None
    path = parts.path.rstrip('/')
    if any(segment in ('.', '..') for segment in path.split('/')) or not _HEADER_VALUE.fullmatch(path):
        raise ValueError(f'endpoint path must not have "." or ".." segments or control characters, got {shown!r}')
    return parts.scheme, parts.netloc, path


def _check_header_text(name: str, value: object, *, secret: bool = False) -> None:
    """`ValueError` unless `value` is text that can be sent in a header as is (printable ASCII, no spaces)."""
    if isinstance(value, str) and _HEADER_TOKEN.fullmatch(value) and (secret or '/' not in value):
        return
    shown = '' if secret else f', got {value!r}'
    allowed = 'printable ASCII without spaces' if secret else 'printable ASCII without spaces or "/"'
    raise ValueError(f'{name} must be {allowed}{shown}')


def _xml_children(element: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    """Children named `name`, whatever their XML namespace."""
    return [child for child in element if child.tag.rsplit('}', 1)[-1] == name]


def _xml_text(element: ElementTree.Element, name: str) -> str | None:
    found = _xml_children(element, name)
    return found[0].text if found else None


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class S3Error(RuntimeError):
    """An S3 request failed: `status` is the HTTP status (`None` for a connection error), `code` S3's error code."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _import_httpx2() -> Any:
    try:
        import httpx2
    except ImportError as error:
        raise ImportError(
            "S3MediaStore needs an HTTP client that is not installed: pip install 'step-persistence[s3]'"
        ) from error
    return httpx2


def _encode_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """User metadata as `x-amz-meta-*` headers; `ValueError` for keys that S3 would not give back as written."""
    headers = {}
    for key, value in metadata.items():
        if not _META_KEY.fullmatch(key):
            raise ValueError(
                f'S3 metadata key {key!r} is not allowed: use lowercase ASCII letters, digits, "-" and "_", '
                'starting with a letter or digit (S3 lowercases keys and sends them as HTTP headers)'
            )
        headers[_META_PREFIX + key] = quote(value, safe=_META_VALUE_SAFE)
    return headers


def _decode_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        name[len(_META_PREFIX) :]: unquote(value)
        for name, value in headers.items()
        if name.lower().startswith(_META_PREFIX)
    }


def _error_code(response: httpx2.Response) -> str | None:
    """S3's error code (`NoSuchKey`, `SignatureDoesNotMatch`, ...) from an error response's XML body."""
    match = _ERROR_CODE.search(response.content)
    return match.group(1).decode('utf-8', 'replace') if match else None


class S3MediaStore(ClosesOnExit):
    """Blobs as objects `<key_prefix><key>` (default key `<sha256>.bin`) in `bucket` at `endpoint`.

    `endpoint` is the service URL (`https://s3.us-east-1.amazonaws.com`, an R2 account URL with
    `region='auto'`, `http://127.0.0.1:9000` for MinIO); requests are path-style and signed with
    SigV4, with `session_token` for temporary credentials. `Content-Type` is the context's
    `media_type`, its `filename` becomes `Content-Disposition`, and user metadata travels as
    `x-amz-meta-*` headers: keys must be lowercase `[a-z0-9][a-z0-9_-]*`, values are any text
    (percent-encoded on the wire where they are not printable ASCII), and S3 caps the total at
    2 KB. Requests failing with 429/5xx or a connection error are retried `max_attempts` times
    in all, with exponential backoff and jitter starting at `backoff_seconds`.

    A blob's touched time is its object's `LastModified` (the server's clock): `put` of stored
    bytes and `touch` copy the object onto itself (a server-side copy keeping its headers and
    metadata), `list_blobs` lists the bucket under `key_prefix` (ListObjectsV2), and `delete_blob`
    checks `LastModified` with a `HEAD` just before its `DELETE` (S3 cannot make that atomic).

    `put` of bytes already stored checks the object first: its `Content-Length`, and its `ETag`
    where the bucket makes that the MD5 of the content (unencrypted or SSE-S3 objects uploaded in
    one request, as this store does), so an object overwritten with other bytes is uploaded again
    instead of being relied on, with no request more than a touch. The media walker therefore
    calls `put` rather than `touch` when it reuses a blob (`put_checks_stored_copy`).

    Everything that goes into a request is checked when the store is built (`endpoint` without
    credentials and with an ASCII host, `bucket`, `region`, `key_prefix` without empty, `.` or
    `..` segments, the access key and session token) and in `put` (a `media_type` must be
    printable ASCII): what S3 would refuse raises `ValueError` before anything is sent.

    One HTTP client serves every request. A `client` passed in (an `httpx2.AsyncClient`) is
    used as is and never closed; a store that created its own closes it in `aclose()`.
    """

    put_checks_stored_copy: ClassVar[bool] = True
    """`put` of stored bytes checks the stored object and uploads it again if it differs (read by the media walker)."""

    def __init__(
        self,
        bucket: str,
        endpoint: str,
        region: str,
        access_key_id: str,
        secret_access_key: str,
        key_prefix: str = '',
        *,
        session_token: str | None = None,
        client: httpx2.AsyncClient | None = None,
        key_strategy: KeyStrategy = default_key_strategy,
        public_url: PublicUrlResolver | None = None,
        max_attempts: int = 4,
        backoff_seconds: float = 0.2,
        timeout_seconds: float = 60.0,
    ) -> None:
        httpx = _import_httpx2()
        scheme, host, base_path = _check_endpoint(endpoint)
        if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket) or '..' in bucket:
            raise ValueError(
                'bucket must be a bucket name (3 to 255 ASCII letters, digits, ".", "-" and "_", starting and '
                f'ending with a letter or digit, no ".."), got {bucket!r}'
            )
        if not isinstance(region, str) or not _REGION.fullmatch(region):
            raise ValueError(f'region must be a region name (ASCII letters, digits, "-", "_", "."), got {region!r}')
        _check_header_text('access_key_id', access_key_id)
        if not isinstance(secret_access_key, str) or not secret_access_key:
            raise ValueError('secret_access_key must be a non-empty string')
        if session_token is not None:
            _check_header_text('session_token', session_token, secret=True)
        if max_attempts < 1:
            raise ValueError(f'max_attempts must be >= 1, got {max_attempts!r}')
        self.bucket = bucket
        self.endpoint = endpoint.rstrip('/')
        self.region = region
        self.key_prefix = _check_key_prefix(key_prefix)
        self._origin = f'{scheme}://{host}'
        self._host = host
        self._base_path = base_path
        self._md5_etags: bool | None = None
        """Whether the bucket's ETags of single-request uploads are their MD5 (learnt from our puts)."""
        self._credentials = Credentials(access_key_id, secret_access_key, session_token)
        self._key_strategy = key_strategy
        self._public_url = public_url
        self._max_attempts = max_attempts
        self._backoff = backoff_seconds
        self._owns_client = client is None
        self._client: httpx2.AsyncClient = client if client is not None else httpx.AsyncClient(timeout=timeout_seconds)
        self._httpx = httpx

    def key_for(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str:
        """The object key of the blob at `uri` (with `key_prefix`)."""
        return self.key_prefix + blob_key(self._key_strategy, uri, context)

    async def _request(
        self,
        method: str,
        key: str,
        *,
        body: bytes = b'',
        payload_sha256: str = EMPTY_SHA256,
        headers: Mapping[str, str] | None = None,
        query: Sequence[tuple[str, str]] = (),
    ) -> httpx2.Response:
        """Send a signed request for `key` (the bucket itself if empty; retrying transient failures)."""
        path = encode_path(f'{self._base_path}/{self.bucket}/{key}' if key else f'{self._base_path}/{self.bucket}')
        query_string = '&'.join(f'{quote(name, safe="~")}={quote(value, safe="~")}' for name, value in sorted(query))
        url = self._origin + path + (f'?{query_string}' if query_string else '')
        base_headers = {'host': self._host, 'x-amz-content-sha256': payload_sha256, **(headers or {})}
        attempt = 1
        while True:
            signed = {
                **base_headers,
                **sign(
                    method=method,
                    path=path,
                    query=query,
                    headers=base_headers,
                    payload_sha256=payload_sha256,
                    credentials=self._credentials,
                    region=self.region,
                ),
            }
            try:
                response = await self._client.request(method, url, content=body, headers=signed)
            except self._httpx.TransportError as error:
                if attempt == self._max_attempts:
                    raise S3Error(
                        f'S3 {method} {self.bucket}/{key} failed after {attempt} attempts: {redact_text(repr(error))}'
                    ) from error
            else:
                if response.status_code not in _RETRY_STATUSES or attempt == self._max_attempts:
                    return response
            await anyio.sleep(self._backoff * 2 ** (attempt - 1) * (0.5 + random.random()))
            attempt += 1

    def _error(self, method: str, key: str, response: httpx2.Response) -> S3Error:
        code = _error_code(response)
        hint = ''
        if response.status_code == 403:
            hint = " (check the access key id, secret access key and region, and the key's rights on the bucket)"
        described = f'HTTP {response.status_code} {code}' if code else f'HTTP {response.status_code}'
        return S3Error(
            f'S3 {method} {self.bucket}/{key} failed: {described}{hint}',
            status=response.status_code,
            code=code,
        )

    async def _head(self, uri: str, context: MediaContext) -> httpx2.Response | None:
        key = self.key_for(uri, context=context)
        response = await self._request('HEAD', key)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._error('HEAD', key, response)
        return response

    async def put(self, data: bytes, *, context: MediaContext = NO_CONTEXT) -> str:
        """Store `data`, unless the object is there and holds it (then touch it); an object that holds
        other bytes (overwritten behind the store's back) is uploaded again."""
        media_type = context.media_type or 'application/octet-stream'
        if not _HEADER_VALUE.fullmatch(media_type):
            raise ValueError(f'media_type must be printable ASCII to be sent as Content-Type, got {media_type!r}')
        data = bytes(data)
        uri = media_uri_for(data)
        key = self.key_for(uri, context=context)
        headers = {'content-type': media_type, **_encode_metadata(context.metadata)}
        if context.filename is not None:
            headers['content-disposition'] = f"inline; filename*=UTF-8''{quote(context.filename, safe='')}"
        head = await self._head(uri, context)
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if head is not None and self._holds(head, data, md5):
            if await self._copy_onto_itself(key, head):
                return uri
            head = None  # deleted meanwhile
        if head is None:
            headers['if-none-match'] = '*'  # a concurrent put of the same bytes wins as well
        response = await self._request('PUT', key, body=data, payload_sha256=parse_media_uri(uri), headers=headers)
        if response.status_code not in (200, 412):
            raise self._error('PUT', key, response)
        if response.status_code == 200 and 'etag' in response.headers:
            self._md5_etags = response.headers['etag'].strip('"') == md5
        return uri

    def _holds(self, head: httpx2.Response, data: bytes, md5: str) -> bool:
        """Whether the object `head` describes holds `data`, as far as its headers tell.

        Its length must match; its ETag must be the MD5 of `data` unless the bucket does not make
        ETags MD5s (encrypted with KMS or a customer key, for instance: learnt from our own puts).
        """
        if head.headers.get('content-length') != str(len(data)):
            return False
        etag = head.headers.get('etag', '').strip('"')
        return self._md5_etags is False or not _MD5_HEX.fullmatch(etag) or etag == md5

    async def get(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bytes:
        key = self.key_for(uri, context=context)
        response = await self._request('GET', key)
        if response.status_code == 404 and _error_code(response) in (None, 'NoSuchKey'):
            raise FileNotFoundError(f'blob {uri} is not in s3 bucket {self.bucket} (key {key})')
        if response.status_code != 200:
            raise self._error('GET', key, response)
        return check_digest(uri, response.content)

    async def exists(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        return await self._head(uri, context) is not None

    async def public_url(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str | None:
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Mapping[str, str]:
        response = await self._head(uri, context)
        if response is None:
            raise FileNotFoundError(f'blob {uri} is not in s3 bucket {self.bucket}')
        return _decode_metadata(response.headers)

    async def touch(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        """Copy the object onto itself (refreshing `LastModified`, keeping headers and metadata)."""
        head = await self._head(uri, context)
        if head is None:
            return False
        return await self._copy_onto_itself(self.key_for(uri, context=context), head)

    async def _copy_onto_itself(self, key: str, head: httpx2.Response) -> bool:
        """Refresh the object's `LastModified` keeping its headers and metadata; `False` if it is gone."""
        headers = {
            'x-amz-copy-source': quote(f'/{self.bucket}/{key}', safe='/~'),
            'x-amz-metadata-directive': 'REPLACE',
            **{name: head.headers[name] for name in _COPIED_HEADERS if name in head.headers},
            **{name.lower(): value for name, value in head.headers.items() if name.lower().startswith(_META_PREFIX)},
        }
        response = await self._request('PUT', key, headers=headers)
        if response.status_code == 404:
            return False
        if response.status_code != 200:
            raise self._error('PUT (copy)', key, response)
        return True

    async def list_blobs(self) -> AsyncIterator[StoredBlob]:
        """The objects under `key_prefix` whose key names a digest (ListObjectsV2, page by page)."""
        token: str | None = None
        while True:
            query = [('list-type', '2'), ('prefix', self.key_prefix)]
            if token is not None:
                query.append(('continuation-token', token))
            response = await self._request('GET', '', query=query)
            if response.status_code != 200:
                raise self._error('GET (list)', self.key_prefix, response)
            root = ElementTree.fromstring(response.content)
            for entry in _xml_children(root, 'Contents'):
                key, modified = _xml_text(entry, 'Key'), _xml_text(entry, 'LastModified')
                if key is None or modified is None:
                    continue
                uri = uri_of_key(key[len(self.key_prefix) :])
                if uri is not None:
                    touched = _aware(datetime.fromisoformat(modified.replace('Z', '+00:00')))
                    yield StoredBlob(uri, key, touched)
            token = _xml_text(root, 'NextContinuationToken')
            if _xml_text(root, 'IsTruncated') != 'true' or not token:
                return

    async def delete_blob(self, blob: StoredBlob, *, touched_before: datetime | None = None) -> bool:
        """`DELETE` the object if a `HEAD` just before finds it (with `touched_before`: untouched since)."""
        head = await self._request('HEAD', blob.key)
        if head.status_code == 404:
            return False
        if head.status_code != 200:
            raise self._error('HEAD', blob.key, head)
        modified = head.headers.get('last-modified')
        if touched_before is not None and (
            modified is None or _aware(parsedate_to_datetime(modified)) >= touched_before
        ):
            return False
        response = await self._request('DELETE', blob.key)
        if response.status_code not in (200, 204):
            raise self._error('DELETE', blob.key, response)
        return True

    async def aclose(self) -> None:
        """Close the HTTP client if this store created it."""
        if self._owns_client:
            await self._client.aclose()
