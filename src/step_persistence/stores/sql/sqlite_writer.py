"""One thread per SQLite engine runs the process's write transactions, several in one commit when they queue up.

SQLite admits one writer at a time, so the writes of one process take turns anyway. Each turn
used to cost a worker thread taken from a pool, the write lock, a commit and an event-loop
wake-up of its own. The writer thread instead takes every operation queued at the moment it is
free and runs them in one transaction: with several, each runs inside a savepoint, so one that
raises is undone alone and only its caller gets the exception; the group commits once, and the
results go back to each event loop with one wake-up. A single agent sees one operation per turn
(nothing changes but a cheaper hand-off); many agents of one process flushing at once share
commits. Operations run in the order they were submitted.

A caller's result is the outcome of its own operation, delivered only after the group's commit:
if the commit fails, every operation of the group raises that error (none of them is stored).
The thread starts on first use and ends after `IDLE_SECONDS` without work, or when stopped. It
keeps one pooled connection checked out while it lives (given back when it ends, and replaced
after a group that failed), so a group pays no checkout or check-in of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Connection, Engine

from step_persistence._cancellation import run_to_completion
from step_persistence.stores.sql.engines import WRITE_OPTION

__all__ = ['IDLE_SECONDS', 'MAX_GROUP', 'SqliteWriter']

T = TypeVar('T')

IDLE_SECONDS = 5.0
"""How long the writer thread waits for work before it ends (the next operation starts it again)."""

MAX_GROUP = 100
"""The most operations one transaction takes."""

_SAVEPOINT = 'step_persistence_operation'


@dataclass(eq=False, slots=True)
class _Job(Generic[T]):
    operation: Callable[[Connection], T]
    write: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]
    outcome: tuple[bool, Any] | None = None
    """`(True, result)` or `(False, exception)` once the operation ran; `None` before."""


class SqliteWriter:
    """Runs operations, grouped, in transactions on a connection of `engine` (`BEGIN IMMEDIATE` when one writes)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    async def run(self, operation: Callable[[Connection], T], *, write: bool) -> T:
        """`operation(connection)`'s result, once the transaction it ran in committed.

        Cancelling the caller does not interrupt the operation: the caller waits for its outcome
        (so a cancelled write is never left in doubt), then raises `CancelledError`.
        """
        loop = asyncio.get_running_loop()
        job: _Job[T] = _Job(operation, write, loop, loop.create_future())
        with self._lock:
            self._jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name='step-persistence-sqlite-writer', daemon=True)
                self._thread.start()
        return await run_to_completion(job.future)

    def stop(self) -> None:
        """Finish the queued operations and end the thread (blocks: call it from a worker thread)."""
        with self._lock:
            thread = self._thread
            if thread is not None:
                self._jobs.put(None)
        if thread is not None:
            thread.join()

    def _serve(self) -> None:
        connection: Connection | None = None
        try:
            while group := self._take():
                connection = self._run(connection, group)
        finally:
            if connection is not None:
                _discard(connection)

    def _take(self) -> list[_Job[Any]]:
        """The operations queued now, waiting for the first; empty when the thread should end."""
        while True:
            try:
                first = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                first = None
            if first is not None:
                break
            with self._lock:
                if self._jobs.empty():
                    self._thread = None
                    return []
        group = [first]
        while len(group) < MAX_GROUP:
            try:
                queued = self._jobs.get_nowait()
            except queue.Empty:
                break
            if queued is not None:
                group.append(queued)
        return group

    def _run(self, connection: Connection | None, group: list[_Job[Any]]) -> Connection | None:
        """Run `group` in one transaction on `connection` (`None`: a new one) and hand the outcomes back; the
        connection for the next group, `None` after a failure (checking one out included), so that nothing of
        a failed transaction stays on the next group's connection."""
        try:
            if connection is None:
                connection = self._engine.connect()
            connection.execution_options(**{WRITE_OPTION: any(job.write for job in group)})
            with connection.begin():
                if len(group) == 1:
                    group[0].outcome = (True, group[0].operation(connection))
                else:
                    _run_in_savepoints(connection, group)
        except BaseException as error:  # it ended these operations: their callers get it
            if connection is not None:
                _discard(connection)
                connection = None
            for job in group:
                if job.outcome is None or job.outcome[0]:
                    job.outcome = (False, error)
        by_loop: dict[asyncio.AbstractEventLoop, list[_Job[Any]]] = {}
        for job in group:
            by_loop.setdefault(job.loop, []).append(job)
        for loop, jobs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, jobs)
            except RuntimeError:
                continue  # that event loop is closed: nobody waits for these results
        return connection


def _run_in_savepoints(connection: Connection, group: list[_Job[Any]]) -> None:
    driver: Any = connection.connection.driver_connection
    for job in group:
        driver.execute(f'SAVEPOINT {_SAVEPOINT}')
        try:
            job.outcome = (True, job.operation(connection))
        except Exception as error:  # undone alone, delivered to its caller
            driver.execute(f'ROLLBACK TO {_SAVEPOINT}')
            job.outcome = (False, error)
        driver.execute(f'RELEASE {_SAVEPOINT}')


def _discard(connection: Connection) -> None:
    """Give `connection` back to the pool; a connection that fails to close is dropped all the same."""
    with contextlib.suppress(Exception):
        connection.close()


def _settle(jobs: list[_Job[Any]]) -> None:
    for job in jobs:
        if job.future.done() or job.outcome is None:
            continue
        succeeded, value = job.outcome
        if succeeded:
            job.future.set_result(value)
        else:
            job.future.set_exception(value)
