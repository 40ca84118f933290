"""A media store wrapper that counts the calls reaching a real store, to check what the walker sends."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import anyio

from step_persistence.media import MediaContext, MediaStore
from step_persistence.media.protocol import NO_CONTEXT


class CountingMediaStore:
    """Forwards every call to `inner`, counting calls per method and recording the blobs put.

    With `gate_after=n`, each `put` waits (at most `gate_timeout` seconds, then fails) until `n`
    puts are in flight at once: puts that run one after the other cannot pass that gate.
    """

    def __init__(self, inner: MediaStore, *, gate_after: int | None = None) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.put_data: list[bytes] = []
        self._gate_after = gate_after
        self._in_flight = 0
        self._gate = anyio.Event()

    async def put(self, data: bytes, *, context: MediaContext = NO_CONTEXT) -> str:
        self.calls['put'] += 1
        self.put_data.append(data)
        if self._gate_after is not None:
            self._in_flight += 1
            if self._in_flight >= self._gate_after:
                self._gate.set()
            with anyio.fail_after(5):
                await self._gate.wait()
        return await self.inner.put(data, context=context)

    async def get(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bytes:
        self.calls['get'] += 1
        return await self.inner.get(uri, context=context)

    async def exists(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> bool:
        self.calls['exists'] += 1
        return await self.inner.exists(uri, context=context)

    async def public_url(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> str | None:
        return await self.inner.public_url(uri, context=context)

    async def get_metadata(self, uri: str, *, context: MediaContext = NO_CONTEXT) -> Mapping[str, str]:
        return await self.inner.get_metadata(uri, context=context)
