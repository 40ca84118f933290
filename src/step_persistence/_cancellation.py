"""Finishing an operation whatever happens to its caller: the one shield every writer uses.

A store write abandoned by a cancelled caller could still complete later (on another thread,
connection or server), after the write its caller makes next, so writes of one run would land
out of order and nobody would know whether the first one happened. Every place that must not
abandon a write awaits it through `run_to_completion`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

__all__ = ['run_to_completion']

T = TypeVar('T')

_ANYIO_ASYNCIO = 'anyio._backends._asyncio'


async def run_to_completion(operation: Awaitable[T]) -> T:
    """The outcome of `operation`, awaited to its end even if the caller is cancelled meanwhile.

    If the caller was cancelled (an asyncio `Task.cancel`, `asyncio.timeout`, however many times)
    while `operation` ran, that cancellation is raised once `operation` has ended, and the
    operation's own result or error is dropped. An anyio cancel scope's cancellation reaches the
    caller at its next checkpoint after this returns. `operation` may be a coroutine, a task or a
    future (one completed from another thread, for instance).
    """
    task = asyncio.ensure_future(operation)
    cancellation: asyncio.CancelledError | None = None
    with _anyio_shield():
        while not task.done():
            try:
                await _ended(task)
            except asyncio.CancelledError as error:
                cancellation = error
    if cancellation is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the caller sees its cancellation, not the operation's outcome
        raise cancellation
    return task.result()


def _anyio_shield() -> AbstractContextManager[object]:
    """A shield from anyio's cancel scopes, where there can be any: only once anyio's asyncio backend is
    imported (every anyio cancel scope, task group or timeout imports it). Before, no anyio scope
    encloses the caller, and importing the backend for nothing costs about 15 ms (issue 18, item 5)."""
    if _ANYIO_ASYNCIO not in sys.modules:
        return contextlib.nullcontext()
    import anyio

    return anyio.CancelScope(shield=True)


async def _ended(task: asyncio.Future[Any]) -> None:
    """Wait until `task` is done; cancelling the wait leaves `task` running (as `asyncio.wait`, with less work)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    try:
        await waiter
    finally:
        task.remove_done_callback(wake)
