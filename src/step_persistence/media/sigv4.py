"""AWS Signature Version 4 for request headers, as S3 and S3-compatible servers check it.

Pure functions with no HTTP client: the caller builds the request, asks for the headers to add,
and sends exactly what was signed. Checked against the published AWS SigV4 test-suite and S3
documentation examples (tests/media/test_sigv4.py).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

__all__ = ['EMPTY_SHA256', 'Credentials', 'canonical_request', 'encode_path', 'sign']

EMPTY_SHA256 = hashlib.sha256(b'').hexdigest()
"""The payload hash of a request without a body."""

_ALGORITHM = 'AWS4-HMAC-SHA256'


@dataclass(frozen=True)
class Credentials:
    """A static access key; `session_token` for temporary (STS) credentials."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def encode_path(path: str) -> str:
    """Percent-encode a path once, as S3 expects: every byte but `A-Za-z0-9-._~` and `/`."""
    return quote(path, safe='/~')


def _encode_query(query: Sequence[tuple[str, str]]) -> str:
    pairs = sorted((quote(name, safe='~'), quote(value, safe='~')) for name, value in query)
    return '&'.join(f'{name}={value}' for name, value in pairs)


def _canonical_headers(headers: Mapping[str, str]) -> tuple[str, str]:
    canonical = {name.lower().strip(): ' '.join(value.split()) for name, value in headers.items()}
    names = sorted(canonical)
    return ''.join(f'{name}:{canonical[name]}\n' for name in names), ';'.join(names)


def canonical_request(
    method: str, path: str, query: Sequence[tuple[str, str]], headers: Mapping[str, str], payload_sha256: str
) -> tuple[str, str]:
    """The canonical request and its signed-header list; `path` must already be percent-encoded."""
    canonical_headers, signed_headers = _canonical_headers(headers)
    text = '\n'.join([method.upper(), path, _encode_query(query), canonical_headers, signed_headers, payload_sha256])
    return text, signed_headers


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode('utf-8'), hashlib.sha256).digest()


def sign(
    *,
    method: str,
    path: str,
    query: Sequence[tuple[str, str]] = (),
    headers: Mapping[str, str],
    payload_sha256: str,
    credentials: Credentials,
    region: str,
    service: str = 's3',
    now: datetime | None = None,
) -> dict[str, str]:
    """The headers to add to a request so that it carries a SigV4 signature.

    `headers` must include `host` and every other header to be signed (all of them are); the
    result holds `x-amz-date`, `x-amz-security-token` when there is a session token, and
    `Authorization`. `path` is the percent-encoded path (`encode_path`), `query` the decoded
    query parameters, `payload_sha256` the hex SHA-256 of the body.
    """
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    amz_date = moment.strftime('%Y%m%dT%H%M%SZ')
    added = {'x-amz-date': amz_date}
    if credentials.session_token:
        added['x-amz-security-token'] = credentials.session_token
    request, signed_headers = canonical_request(method, path, query, {**headers, **added}, payload_sha256)
    scope = f'{amz_date[:8]}/{region}/{service}/aws4_request'
    string_to_sign = '\n'.join([_ALGORITHM, amz_date, scope, hashlib.sha256(request.encode('utf-8')).hexdigest()])
    key = ('AWS4' + credentials.secret_access_key).encode('utf-8')
    for part in (amz_date[:8], region, service, 'aws4_request'):
        key = _hmac(key, part)
    signature = hmac.new(key, string_to_sign.encode('utf-8'), hashlib.sha256).hexdigest()
    added['Authorization'] = (
        f'{_ALGORITHM} Credential={credentials.access_key_id}/{scope}, '
        f'SignedHeaders={signed_headers}, Signature={signature}'
    )
    return added
