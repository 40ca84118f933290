"""Stores with different `max_snapshots_per_run` over the same data: readers see what the writers retained."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from step_persistence import ContinuableSnapshot, RunRecord, StepStore, from_spec
from step_persistence.testing.conformance import sample_history
from support.backends import BackendSession, spec_of

pytestmark = pytest.mark.anyio

Opener = Callable[..., Any]


@pytest.fixture
async def open_shared(durable_session: BackendSession) -> AsyncIterator[Opener]:
    """`await open_shared(**options)`: another store over the one data set of the test, closed at its end."""
    async with AsyncExitStack() as stores:

        async def open_store(**options: Any) -> StepStore:
            store: StepStore = from_spec(**spec_of(durable_session, **options))
            return await stores.enter_async_context(store)

        yield open_store


def snapshot(step: int) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id='r', step_index=step, messages=sample_history(step))


async def test_a_reader_sees_what_a_stricter_writer_kept_without_warnings(
    open_shared: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    writer = await open_shared(max_snapshots_per_run=1)
    await writer.register_run(RunRecord(run_id='r'))
    for step in (1, 2, 3):
        await writer.save_snapshot(snapshot(step))
    for limit in (None, 5):
        reader = await open_shared(max_snapshots_per_run=limit)
        with caplog.at_level(logging.WARNING, logger='step_persistence'):
            assert [s.step_index for s in await reader.list_snapshots(run_id='r')] == [3]
            latest = await reader.latest_snapshot(run_id='r')
        assert latest is not None and latest.step_index == 3
        warned = [record.getMessage() for record in caplog.records if record.name.startswith('step_persistence')]
        assert warned == [], 'snapshots pruned by another store are not unreadable ones'


async def test_a_stricter_store_prunes_only_when_it_saves(open_shared: Opener) -> None:
    keeping_all = await open_shared()
    await keeping_all.register_run(RunRecord(run_id='r'))
    for step in (1, 2, 3):
        await keeping_all.save_snapshot(snapshot(step))
    strict = await open_shared(max_snapshots_per_run=2)
    assert [s.step_index for s in await strict.list_snapshots(run_id='r')] == [1, 2, 3]
    await strict.save_snapshot(snapshot(4))
    for store in (strict, keeping_all):
        assert [s.step_index for s in await store.list_snapshots(run_id='r')] == [3, 4]
