"""Reads of a SQLite file run on the executor's own threads (`ThreadExecutor`): several at once, each in a
copy of its caller's context, and a cancelled caller waits for its read to end (a thread cannot be
interrupted), under asyncio's cancellation and under anyio's cancel scopes alike."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from step_persistence.stores.sql.engines import sqlite_engine
from step_persistence.stores.sql.executors import ThreadExecutor, Transaction

pytestmark = pytest.mark.anyio

CALLER = contextvars.ContextVar[str]('CALLER', default='nobody')


@pytest.fixture
def executor(tmp_path: Path) -> ThreadExecutor:
    engine = sqlite_engine(str(tmp_path / 'reads.db'), busy_timeout=5.0, synchronous='NORMAL', pool_size=3)
    return ThreadExecutor(engine, threads=2)


def blocked_read(started: threading.Event, release: threading.Event, ended: list[str]) -> Callable[[Transaction], str]:
    """A read that signals it started, waits for `release`, and notes the caller's context once it ends."""

    def read(transaction: Transaction) -> str:
        started.set()
        assert release.wait(10), 'the test never released the read'
        ended.append(CALLER.get())
        return str(transaction.connection.exec_driver_sql('SELECT 1').scalar())

    return read


async def test_reads_run_together_in_their_callers_context(executor: ThreadExecutor) -> None:
    both_started = threading.Barrier(2, timeout=10)
    seen: list[str] = []

    def read(transaction: Transaction) -> None:
        both_started.wait()  # two reads at once, or this times out
        seen.append(CALLER.get())

    async def as_caller(name: str) -> None:
        CALLER.set(name)
        await executor.run(read, write=False, options={})

    async with anyio.create_task_group() as group:
        group.start_soon(as_caller, 'first')
        group.start_soon(as_caller, 'second')
    assert sorted(seen) == ['first', 'second']
    await executor.dispose()


async def test_an_asyncio_cancelled_caller_waits_for_its_read(executor: ThreadExecutor) -> None:
    started, release, ended = threading.Event(), threading.Event(), []
    CALLER.set('caller')
    task = asyncio.ensure_future(executor.run(blocked_read(started, release, ended), write=False, options={}))
    await anyio.to_thread.run_sync(started.wait)
    task.cancel()
    await asyncio.sleep(0)  # let the cancellation reach the read's await
    assert not task.done(), 'the caller waits while its read runs'
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended == ['caller']
    await executor.dispose()


async def test_an_anyio_cancel_scope_reaches_the_caller_after_its_read(executor: ThreadExecutor) -> None:
    started, release, ended = threading.Event(), threading.Event(), []
    outcome: list[str] = []

    async def reading(scope: anyio.CancelScope) -> None:
        with scope:
            await executor.run(blocked_read(started, release, ended), write=False, options={})
            outcome.append('read returned')
            await anyio.lowlevel.checkpoint()
            outcome.append('not cancelled')

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as group:
        group.start_soon(reading, scope)
        await anyio.to_thread.run_sync(started.wait)
        scope.cancel()
        for _ in range(3):
            await anyio.lowlevel.checkpoint()  # the cancellation delivered, while the read still runs
        assert ended == []
        release.set()
    assert outcome == ['read returned'], 'the scope cancelled the caller at its first checkpoint after the read'
    assert ended == ['nobody']
    await executor.dispose()
