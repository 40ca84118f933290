"""Per-run call order for a store whose operations are network round trips.

Two calls on one run made one after the other by different tasks (a tool's `completed` record,
then the `failed` record the capability writes when the run discards that result) travel on
different pooled connections and could reach the server in either order. Each run's calls
therefore take turns, first come first served (`RunTurns`). A write, once called, runs to
completion even if its caller is cancelled meanwhile (`run_to_completion`): cancelling the caller
mid-round-trip would otherwise leave it unknown whether the write happened, and would let the next
call on the run overtake it. A batch touching several runs takes their turns in sorted order, so
batches never wait on each other in a cycle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from step_persistence._cancellation import run_to_completion
from step_persistence._reading import logger
from step_persistence.stores._turns import RunTurns

__all__ = ['CallOrder']

T = TypeVar('T')


class CallOrder:
    """Runs each run's operations one at a time in call order; writes survive their caller's cancellation."""

    def __init__(self) -> None:
        self._turns = RunTurns()
        self._writes: set[asyncio.Task[Any]] = set()

    async def read(self, run_id: str, operation: Callable[[], Awaitable[T]]) -> T:
        """`await operation()` once every earlier call on `run_id` is done."""
        async with self._turns.turn(run_id):
            return await operation()

    async def write(self, run_ids: Iterable[str], operation: Callable[[], Awaitable[T]]) -> T:
        """`await operation()` in the turn of every run in `run_ids`, to its end even if the caller is cancelled.

        A cancelled caller gets its cancellation once the write has ended; if the write failed
        meanwhile, the failure is logged, since nobody else sees it.
        """
        task = asyncio.ensure_future(self._in_turns(sorted(set(run_ids)), operation))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        try:
            return await run_to_completion(task)
        except asyncio.CancelledError:
            if not task.cancelled() and task.exception() is not None:
                logger.warning('a write whose caller was cancelled failed: %r', task.exception())
            raise

    async def _in_turns(self, run_ids: list[str], operation: Callable[[], Awaitable[T]]) -> T:
        async with AsyncExitStack() as turns:
            for run_id in run_ids:
                await turns.enter_async_context(self._turns.turn(run_id))
            return await operation()

    async def drain(self) -> None:
        """Wait for every write still running (another task's, or one whose cancelled caller nobody awaits)."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
