"""A real S3-compatible server for the tests: `nanio` (test-only), which checks SigV4 signatures.

`s3_server` starts one `nanio serve` per test session on 127.0.0.1 with a free port, a data
directory in the session's temporary directory and a bucket created with a signed `PUT`. Tests
share the bucket and isolate themselves with a key prefix of their own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx2
import pytest

from step_persistence.media.sigv4 import Credentials, encode_path, sign
from support.servers import free_port, skip_if_opted_out, start_server, stop_server

__all__ = ['S3Server', 's3_server']


@dataclass(frozen=True)
class S3Server:
    """Where the session's server listens, its credentials, and raw signed requests for test setup."""

    endpoint: str
    region: str
    bucket: str
    access_key_id: str
    secret_access_key: str = field(repr=False)

    def request(
        self, method: str, path: str, body: bytes = b'', headers: Mapping[str, str] | None = None
    ) -> httpx2.Response:
        """Send one signed request for `path` (e.g. `/bucket/key`), bypassing any media store."""
        host = self.endpoint.split('://', 1)[1]
        payload_sha256 = hashlib.sha256(body).hexdigest()
        encoded = encode_path(path)
        unsigned = {'host': host, 'x-amz-content-sha256': payload_sha256, **(headers or {})}
        credentials = Credentials(self.access_key_id, self.secret_access_key)
        signed = sign(
            method=method,
            path=encoded,
            headers=unsigned,
            payload_sha256=payload_sha256,
            credentials=credentials,
            region=self.region,
        )
        return httpx2.request(method, self.endpoint + encoded, content=body, headers={**unsigned, **signed})

    def put_object(self, key: str, body: bytes) -> None:
        """Overwrite an object of the session's bucket with `body`, whatever its key names."""
        response = self.request('PUT', f'/{self.bucket}/{key}', body)
        response.raise_for_status()


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=0.2):
            return True
    except OSError:
        return False


def _nanio_command() -> str:
    command = shutil.which('nanio', path=str(Path(sys.executable).parent)) or shutil.which('nanio')
    if command is None:
        raise RuntimeError('nanio is not installed: it is a test dependency (uv sync installs it)')
    return command


@pytest.fixture(scope='session')
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A running nanio server with an empty bucket, for the whole test session."""
    skip_if_opted_out('s3')
    port = free_port()
    root = tmp_path_factory.mktemp('nanio')
    data_dir, log_path = root / 'data', root / 'nanio.log'
    server = S3Server(
        endpoint=f'http://127.0.0.1:{port}',
        region='us-east-1',
        bucket='media-tests',
        access_key_id='step-persistence-tests',
        secret_access_key='nanio-secret-for-tests-only',
    )
    environment = {
        **os.environ,
        'NANIO_ACCESS_KEY': server.access_key_id,
        'NANIO_SECRET_KEY': server.secret_access_key,
    }
    command = [
        _nanio_command(),
        'serve',
        *('--data-dir', str(data_dir), '--host', '127.0.0.1', '--port', str(port), '--region', server.region),
        *('--log-level', 'warning', '--no-access-log'),
    ]
    ready = partial(_accepts_connections, port)
    process = start_server(command, log_path=log_path, ready=ready, what='nanio S3 server', timeout=30, env=environment)
    try:
        created = server.request('PUT', f'/{server.bucket}')
        if created.status_code != 200:
            raise RuntimeError(f'creating bucket {server.bucket} failed: HTTP {created.status_code} {created.text}')
        yield server
    finally:
        stop_server(process)
