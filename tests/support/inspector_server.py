"""The inspector served for real, in this process: uvicorn on a free port, in a thread with its own event loop.

The store is opened, filled and served on that loop (a store belongs to the loop that uses it);
the test's thread drives a browser against `Served.url` and reaches the store through
`Served.call`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import uvicorn

from step_persistence import StepStore
from step_persistence.inspector import create_app
from support.servers import free_port

__all__ = ['Served', 'serving']

Facts = TypeVar('Facts')
T = TypeVar('T')

START_TIMEOUT = 120
"""Seconds for filling the store and starting the server (a fill may run another process)."""


@dataclass
class Served(Generic[Facts]):
    url: str
    """The inspector's address, ending in `/`."""
    store: StepStore
    facts: Facts
    """What the fill returned."""
    loop: asyncio.AbstractEventLoop

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30) -> T:
        """Run `make()` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(timeout)


class _Server(uvicorn.Server):
    """uvicorn's server, with an event set once it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening.set()


@contextmanager
def serving(
    open_store: Callable[[], StepStore],
    fill: Callable[[StepStore], Awaitable[Facts]],
    *,
    finish: Callable[[Facts], Awaitable[None]] | None = None,
    **app_options: Any,
) -> Iterator[Served[Facts]]:
    """Serve `create_app(store, **app_options)` over a store `open_store()` builds and `fill` fills.

    `finish(facts)` runs on the server's loop after the server stopped, before the store closes.
    """
    ready = threading.Event()
    stop = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        async with open_store() as store:
            facts = await fill(store)
            port = free_port()
            config = uvicorn.Config(
                create_app(store, **app_options), host='127.0.0.1', port=port, log_level='warning', lifespan='off'
            )
            server = _Server(config)
            task = asyncio.create_task(server.serve())
            await asyncio.wait(
                [task, asyncio.create_task(server.listening.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            if task.done():
                await task  # it could not start: its error (or SystemExit) ends the thread
                raise RuntimeError('the inspector stopped before it listened')
            loop = asyncio.get_running_loop()
            state['served'] = Served(url=f'http://127.0.0.1:{port}/', store=store, facts=facts, loop=loop)
            ready.set()
            await loop.run_in_executor(None, stop.wait)
            server.should_exit = True
            await task
            if finish is not None:
                await finish(facts)

    def thread_main() -> None:
        try:
            asyncio.run(main())
        except BaseException as error:
            state['error'] = error
            ready.set()

    thread = threading.Thread(target=thread_main, name='inspector-server', daemon=True)
    thread.start()
    try:
        assert ready.wait(START_TIMEOUT), 'the inspector did not start'
        if 'error' in state:
            raise state['error']
        yield state['served']
    finally:
        stop.set()
        thread.join(60)
    if 'error' in state:
        raise state['error']
