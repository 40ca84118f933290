"""Runs: the protocol shape, registering, reading and listing runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from step_persistence.protocol import StepStore
from step_persistence.records import RunRecord
from step_persistence.testing.conformance.shared import T0, ConformanceBase, StoreFactory


class RunsConformance(ConformanceBase):
    """The protocol shape and the run records."""

    # --- protocol shape ---

    async def test_is_a_step_store(self, store: StepStore) -> None:
        assert isinstance(store, StepStore)

    async def test_async_context_manager_returns_the_store(self, make_store: StoreFactory) -> None:
        store = await make_store()
        async with store as entered:
            assert entered is store
            await self._register(entered, 'ctx-run')
            assert await entered.get_run(run_id='ctx-run') is not None

    # --- runs ---

    async def test_register_and_get_round_trip(self, store: StepStore) -> None:
        record = await self._register(
            store,
            'run-1',
            conversation_id='conv-1',
            parent_run_id='orchestrator',
            agent_name='librarian',
            metadata={'tenant': 'acme', 'ключ': 'значение ✓'},
            started_at=T0,
        )
        assert await store.get_run(run_id='run-1') == record

    async def test_get_unknown_run_is_none(self, store: StepStore) -> None:
        assert await store.get_run(run_id='missing') is None

    async def test_duplicate_register_raises_and_keeps_original(self, store: StepStore) -> None:
        original = await self._register(store, 'dup', agent_name='first', started_at=T0)
        with pytest.raises(ValueError, match='dup'):
            await store.register_run(RunRecord(run_id='dup', agent_name='second'))
        assert await store.get_run(run_id='dup') == original

    async def test_concurrent_duplicate_register_admits_exactly_one(self, store: StepStore) -> None:
        attempts = [RunRecord(run_id='race', agent_name=f'writer-{i}') for i in range(10)]
        results = await asyncio.gather(*(store.register_run(r) for r in attempts), return_exceptions=True)
        winners = [attempt for attempt, result in zip(attempts, results, strict=True) if result is None]
        assert len(winners) == 1
        assert all(isinstance(result, ValueError) for result in results if result is not None)
        assert await store.get_run(run_id='race') == winners[0]

    async def test_timestamps_read_back_as_utc_instants(self, store: StepStore) -> None:
        plus_five = timezone(timedelta(hours=5))
        await self._register(store, 'tz', started_at=datetime(2026, 5, 1, 12, 0, tzinfo=plus_five))
        record = await store.get_run(run_id='tz')
        assert record is not None
        assert record.started_at == datetime(2026, 5, 1, 7, 0, tzinfo=UTC)
        assert record.started_at.utcoffset() == timedelta(0)

    async def test_list_runs_sorts_by_instant_not_by_text(self, store: StepStore) -> None:
        plus_five = timezone(timedelta(hours=5))
        # 10:00+05:00 is 05:00 UTC: earlier than 06:00 UTC although it sorts later as text.
        await self._register(store, 'late', started_at=datetime(2026, 1, 1, 6, 0, tzinfo=UTC))
        await self._register(store, 'early', started_at=datetime(2026, 1, 1, 10, 0, tzinfo=plus_five))
        await self._register(store, 'tie-a', started_at=datetime(2026, 1, 1, 7, 0, tzinfo=UTC))
        await self._register(store, 'tie-b', started_at=datetime(2026, 1, 1, 7, 0, tzinfo=UTC))
        await self._register(store, 'sub-second', started_at=datetime(2026, 1, 1, 6, 0, 0, 1, tzinfo=UTC))
        runs = await store.list_runs()
        assert [run.run_id for run in runs] == ['early', 'late', 'sub-second', 'tie-a', 'tie-b']

    async def test_list_runs_filters_combine(self, store: StepStore) -> None:
        for index, (parent, conversation) in enumerate(
            [('p1', 'c1'), ('p1', 'c2'), ('p2', 'c1'), (None, 'c1'), ('p1', None)]
        ):
            await self._register(
                store,
                f'run-{index}',
                parent_run_id=parent,
                conversation_id=conversation,
                started_at=T0 + timedelta(seconds=index),
            )

        async def ids(**filters: Any) -> list[str]:
            return [run.run_id for run in await store.list_runs(**filters)]

        assert await ids() == [f'run-{i}' for i in range(5)]
        assert await ids(parent_run_id='p1') == ['run-0', 'run-1', 'run-4']
        assert await ids(conversation_id='c1') == ['run-0', 'run-2', 'run-3']
        assert await ids(parent_run_id='p1', conversation_id='c1') == ['run-0']
        assert await ids(parent_run_id='nobody') == []
