"""Per-run call order on the event loop, shared by the stores whose calls can overtake each other.

The in-memory store applies each call the moment it is made. The file store does its work in
worker threads, and the MongoDB store in network round trips on pooled connections; in both, two
calls on one run could otherwise overtake each other (a tool's `completed` record landing after
the `failed` record written when its result was discarded). Making each run's calls wait their
turn, first come first served, keeps the order in which they were made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

__all__ = ['RunTurns']


class RunTurns:
    """A first-in-first-out turn per run id, for tasks of one event loop; idle runs hold no memory."""

    def __init__(self) -> None:
        self._queues: dict[str, tuple[anyio.Lock, int]] = {}

    @asynccontextmanager
    async def turn(self, run_id: str) -> AsyncIterator[None]:
        """Wait until every earlier call on `run_id` is done; hold the turn for the block."""
        lock, waiting = self._queues.get(run_id, (None, 0))
        if lock is None:
            lock = anyio.Lock(fast_acquire=True)
        self._queues[run_id] = (lock, waiting + 1)
        try:
            async with lock:
                yield
        finally:
            lock, waiting = self._queues[run_id]
            if waiting == 1:
                del self._queues[run_id]
            else:
                self._queues[run_id] = (lock, waiting - 1)
