"""`run_to_completion`: the one shield every writer uses against its caller's cancellation."""

from __future__ import annotations

import asyncio
import threading

import anyio
import anyio.lowlevel
import pytest

from step_persistence._cancellation import run_to_completion

pytestmark = pytest.mark.anyio


async def test_returns_the_result_and_raises_the_error_of_an_uncancelled_operation() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def broken() -> None:
        raise KeyError('boom')

    assert await run_to_completion(answer()) == 42
    with pytest.raises(KeyError):
        await run_to_completion(broken())


async def test_a_cancelled_caller_waits_for_the_operation_then_is_cancelled() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    finished: list[str] = []

    async def write() -> str:
        started.set()
        await release.wait()
        finished.append('written')
        return 'done'

    caller = asyncio.ensure_future(run_to_completion(write()))
    await started.wait()
    caller.cancel()
    caller.cancel()  # a second cancellation does not abandon the write either
    await asyncio.sleep(0)
    assert not caller.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert finished == ['written']


async def test_a_failure_after_the_caller_was_cancelled_is_dropped_for_the_cancellation() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def write() -> None:
        started.set()
        await release.wait()
        raise OSError('disk full')

    caller = asyncio.ensure_future(run_to_completion(write()))
    await started.wait()
    caller.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller


async def test_an_anyio_cancel_scope_reaches_the_caller_only_after_the_operation() -> None:
    started, release = anyio.Event(), anyio.Event()
    finished: list[str] = []
    reached: list[str] = []

    async def write() -> None:
        started.set()
        await release.wait()
        finished.append('written')

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:

            async def cancel_when_started() -> None:
                await started.wait()
                scope.cancel()
                release.set()

            group.start_soon(cancel_when_started)
            await run_to_completion(write())
            reached.append('returned')
            await anyio.lowlevel.checkpoint()
            reached.append('after a checkpoint')
    assert scope.cancelled_caught
    assert (finished, reached) == (['written'], ['returned'])


async def test_a_future_completed_from_another_thread() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = loop.create_future()
    thread = threading.Thread(target=lambda: loop.call_soon_threadsafe(future.set_result, 'from thread'))
    thread.start()
    assert await run_to_completion(future) == 'from thread'
    thread.join()
