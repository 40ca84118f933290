"""A TCP proxy in front of a real server that fails the first connections, to test client retries.

Each of the first `failures` connections reads one request and then either answers
`503 Service Unavailable` (`mode='503'`) or closes the socket without answering (`mode='drop'`);
every later connection is piped, byte for byte, to the upstream server. Runs in the test's event
loop; `served` counts the connections it failed, `forwarded` those it piped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Literal

import anyio
from anyio.abc import ByteStream, SocketStream

_RESPONSE_503 = b'HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n'


@dataclass
class FlakyProxy:
    port: int
    failures: int
    mode: Literal['503', 'drop']
    served: int = 0
    forwarded: int = 0

    @property
    def endpoint(self) -> str:
        return f'http://127.0.0.1:{self.port}'


async def _read_request(stream: SocketStream) -> None:
    """Consume one HTTP request (head and `Content-Length` body) from `stream`."""
    buffer = b''
    while b'\r\n\r\n' not in buffer:
        buffer += await stream.receive()
    head, body = buffer.split(b'\r\n\r\n', 1)
    length = 0
    for line in head.split(b'\r\n')[1:]:
        name, _, value = line.partition(b':')
        if name.strip().lower() == b'content-length':
            length = int(value.strip())
    while len(body) < length:
        body += await stream.receive()


async def _pipe(source: ByteStream, sink: ByteStream) -> None:
    with suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        async for chunk in source:
            await sink.send(chunk)
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await sink.send_eof()


@asynccontextmanager
async def flaky_proxy(
    upstream_port: int, *, failures: int, mode: Literal['503', 'drop'] = '503'
) -> AsyncIterator[FlakyProxy]:
    """Serve a `FlakyProxy` on 127.0.0.1 for the duration of the `async with` block."""
    listener = await anyio.create_tcp_listener(local_host='127.0.0.1', local_port=0)
    proxy = FlakyProxy(port=listener.extra(anyio.abc.SocketAttribute.local_port), failures=failures, mode=mode)

    async def handle(client: SocketStream) -> None:
        async with client:
            if proxy.served < proxy.failures:
                proxy.served += 1
                with suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                    await _read_request(client)
                    if proxy.mode == '503':
                        await client.send(_RESPONSE_503)
                return
            proxy.forwarded += 1
            upstream = await anyio.connect_tcp('127.0.0.1', upstream_port)
            async with upstream, anyio.create_task_group() as pipes:
                pipes.start_soon(_pipe, client, upstream)
                pipes.start_soon(_pipe, upstream, client)

    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, handle)
        try:
            yield proxy
        finally:
            group.cancel_scope.cancel()
