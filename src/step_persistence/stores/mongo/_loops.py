"""A Mongo store used from one event loop, then another: its own client per loop, and what it builds on it.

pymongo binds a client to the event loop of its first operation, and an application may use a
store from one loop, then another (`run_sync` and `asyncio.run` in turn), never from two at once.

- `BoundClient`: a client the store built, on the loop it is bound to. It is closed on that loop:
  by the store's `aclose()`, or when the loop is shut down (`asyncio.run` and `asyncio.Runner`,
  anyio's runner too, finalize the loop's async generators before closing it, and a bound client
  keeps one suspended for that), or, once the store has moved to another loop (`let_go`), when
  its loop runs again (at once if it runs in another thread). A loop that never runs again (the
  one `run_sync` leaves idle) takes the client with it when both are garbage collected.
- `PerLoop`: what a store builds on its client (collection handles, locks, per-run turns, the
  caches and index checks that go with them), built again at the first operation on a new loop:
  caches start empty there, and indexes are checked again by the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from step_persistence._reading import logger

if TYPE_CHECKING:
    from step_persistence.stores.mongo._client import MongoClientLike, MongoConnection

__all__ = ['BoundClient', 'PerLoop', 'close_client']

T = TypeVar('T')

_CLOSING: set[asyncio.Task[None]] = set()
"""Closes started on a client's own loop after the store left it, held until they end."""


async def close_client(client: MongoClientLike) -> None:
    """Close `client` (pymongo's `close()` is a coroutine, motor's a plain call)."""
    closed = client.close()
    if inspect.isawaitable(closed):
        await closed


def _forget(generator: AsyncGenerator[None, None]) -> None:
    """The finalizer of a guard collected unfinished (its store dropped without `aclose()`, its loop never shut
    down): nothing can be awaited from the garbage collector, so it is dropped, and its client with it."""


def _start_on_running_loop(guard: AsyncGenerator[None, None]) -> None:
    """Run `guard` to its first `yield`, registered with the running loop's shutdown (its first-iteration hook),
    with `_forget` as its finalizer instead of the loop's (which would schedule it on a loop that may be closed)."""
    firstiter, finalizer = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter, _forget)
    try:
        with contextlib.suppress(StopIteration):  # the step ends at the yield
            guard.asend(None).send(None)
    finally:
        sys.set_asyncgen_hooks(firstiter, finalizer)


class BoundClient:
    """A client the store built and the loop it is bound to (create it on that loop, running); closed once."""

    def __init__(self, client: MongoClientLike) -> None:
        self.client = client
        self.loop = asyncio.get_running_loop()
        self._close: asyncio.Task[None] | None = None
        self._guard = self._closed_at_shutdown()
        _start_on_running_loop(self._guard)

    async def _closed_at_shutdown(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await self.aclose()

    def _closing(self) -> asyncio.Task[None]:
        """The close of the client, started on the running loop (its own) unless it was already."""
        if self._close is None:
            self._close = asyncio.ensure_future(close_client(self.client))
        return self._close

    async def aclose(self) -> None:
        """Close the client, or wait for its close to end if that was started already (call on its loop)."""
        await self._closing()

    def let_go(self) -> None:
        """Close the client on its own loop without waiting (call from another loop).

        Scheduled there: it runs at once if that loop runs in another thread, or whenever it runs
        again. A closed loop runs nothing, but it closed the client when it was shut down.
        """
        if self._close is not None or self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # it closed meanwhile, in another thread
            self.loop.call_soon_threadsafe(self._close_unwatched)

    def _close_unwatched(self) -> None:
        """Start the close nobody awaits (unless the loop's shutdown does): kept until it ends, a failure logged."""
        task = self._closing()
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.warning('closing the MongoDB client of an event loop the store left failed: %r', error)


class PerLoop(Generic[T]):
    """`build(client)` for the running loop and the client its connection serves it with, built again when either
    changes (the step store and its default media store share a connection: either may move it to a new loop)."""

    _value: T

    def __init__(self, connection: MongoConnection, build: Callable[[MongoClientLike], T]) -> None:
        self._connection = connection
        self._build = build
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: MongoClientLike | None = None

    def get(self) -> T:
        """What the running loop uses (call from a coroutine)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._client is not self._connection.client:
            client = self._connection.client_on_running_loop()
            self._value = self._build(client)
            self._loop, self._client = loop, client
        return self._value

    def built_for_running_loop(self) -> T | None:
        """What the running loop uses if it was built already, else `None` (nothing is built)."""
        if self._loop is asyncio.get_running_loop() and self._client is self._connection.client:
            return self._value
        return None
