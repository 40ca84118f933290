"""Runs: the protocol shape, registering, reading and listing runs, runs registered bare by a write."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from step_persistence.protocol import StepStore
from step_persistence.records import RunRecord, StepEvent
from step_persistence.testing.conformance.shared import T0, ConformanceBase, StoreFactory, _dump, _effect, _snapshot


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

    @staticmethod
    async def _exactly_one_registers(store: StepStore, run_id: str, attempts: int) -> None:
        """`attempts` concurrent `register_run`s of `run_id`: one is stored, the others raise `ValueError`."""
        records = [RunRecord(run_id=run_id, agent_name=f'writer-{i}') for i in range(attempts)]
        results = await asyncio.gather(*(store.register_run(r) for r in records), return_exceptions=True)
        winners = [record for record, result in zip(records, results, strict=True) if result is None]
        assert len(winners) == 1
        assert all(isinstance(result, ValueError) for result in results if result is not None)
        assert await store.get_run(run_id=run_id) == winners[0]

    async def test_concurrent_duplicate_register_admits_exactly_one(self, store: StepStore) -> None:
        await self._exactly_one_registers(store, 'race', 10)

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

    # --- bare runs: registered by their first write ---

    async def test_each_kind_of_write_registers_an_unknown_run_bare(self, store: StepStore) -> None:
        event = StepEvent(run_id='by-event', kind='run_started', step_index=0, timestamp=T0)
        snapshot = _snapshot('by-snapshot', 1).model_copy(update={'timestamp': T0 + timedelta(seconds=1)})
        effect = _effect('by-effect', 't', started_at=T0 + timedelta(seconds=2))
        await store.append_event(event)
        await store.save_snapshot(snapshot)
        await store.record_tool_effect(effect)
        for run_id, at in (('by-event', T0), ('by-snapshot', snapshot.timestamp), ('by-effect', effect.started_at)):
            assert await store.get_run(run_id=run_id) == RunRecord(run_id=run_id, started_at=at)
        assert await store.list_events(run_id='by-event') == [event]
        assert await store.list_snapshots(run_id='by-snapshot') == [snapshot]
        assert await store.list_tool_effects(run_id='by-effect') == [effect]
        assert [run.run_id for run in await store.list_runs()] == ['by-event', 'by-snapshot', 'by-effect']
        assert [run.run_id for run in await store.list_runs(agent_name='agent')] == []
        assert await store.list_conversations() == []

    async def test_register_run_fills_a_bare_run_once_and_keeps_its_writes(self, store: StepStore) -> None:
        await store.record_tool_effect(_effect('bare', 't', started_at=T0))
        await store.append_event(StepEvent(run_id='bare', kind='run_started', step_index=0, timestamp=T0))
        await store.save_snapshot(_snapshot('bare', 1))
        record = await self._register(
            store,
            'bare',
            conversation_id='conv',
            parent_run_id='parent',
            agent_name='agent',
            metadata={'tenant': 'acme'},
            started_at=T0 - timedelta(hours=1),
        )
        assert await store.get_run(run_id='bare') == record
        with pytest.raises(ValueError, match='bare'):
            await store.register_run(RunRecord(run_id='bare', agent_name='second'))
        assert await store.get_run(run_id='bare') == record
        await store.save_snapshot(_snapshot('bare', 2))
        assert [_dump(s.messages) for s in await store.list_snapshots(run_id='bare')] == [
            _dump(_snapshot('bare', step).messages) for step in (1, 2)
        ]
        assert [event.kind for event in await store.list_events(run_id='bare')] == ['run_started']
        assert [effect.tool_call_id for effect in await store.list_tool_effects(run_id='bare')] == ['t']
        assert await store.list_runs(conversation_id='conv', agent_name='agent', parent_run_id='parent') == [record]
        [conversation] = await store.list_conversations()
        assert (conversation.conversation_id, conversation.head_run_id, conversation.run_count) == ('conv', 'bare', 1)
        found = await store.find_snapshot(conversation_id='conv', history_digest=_snapshot('bare', 2).history_digest())
        assert found is not None and (found.run_id, found.seq) == ('bare', 2)

    async def test_a_bare_run_keeps_its_place_in_registration_order(self, store: StepStore) -> None:
        await self._register(store, 'first', started_at=T0)
        await store.append_event(StepEvent(run_id='second', kind='run_started', step_index=0, timestamp=T0))
        await self._register(store, 'third', started_at=T0)
        assert [run.run_id for run in await store.list_runs()] == ['first', 'second', 'third']
        await self._register(store, 'second', agent_name='agent', started_at=T0)
        assert [run.run_id for run in await store.list_runs()] == ['first', 'second', 'third']

    async def test_concurrent_first_writes_register_one_bare_run(self, store: StepStore) -> None:
        started = {run_id: T0 + timedelta(seconds=n) for n, run_id in enumerate(['race-a', 'race-b', 'race-c'])}
        run_ids = list(started)
        writes = [
            write
            for run_id, at in started.items()
            for step in range(4)
            for write in (
                store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=step, timestamp=at)),
                store.record_tool_effect(_effect(run_id, f'call-{step}', started_at=at)),
                store.save_snapshot(_snapshot(run_id, step + 1).model_copy(update={'timestamp': at})),
            )
        ]
        await asyncio.gather(*writes)
        assert await store.list_runs() == [RunRecord(run_id=run_id, started_at=at) for run_id, at in started.items()]
        for run_id in run_ids:
            assert sorted(event.step_index for event in await store.list_events(run_id=run_id)) == [0, 1, 2, 3]
            assert len(await store.list_tool_effects(run_id=run_id)) == 4
            assert len(await store.list_snapshots(run_id=run_id)) == 4
        await self._exactly_one_registers(store, 'race-a', 6)  # fills the bare run once

    async def test_register_run_racing_the_first_write_registers_the_run_once(self, store: StepStore) -> None:
        records = [RunRecord(run_id=f'both-{n}', agent_name='agent', started_at=T0 + timedelta(n)) for n in range(4)]
        await asyncio.gather(
            *(store.register_run(record) for record in records),
            *(
                store.append_event(StepEvent(run_id=record.run_id, kind='run_started', step_index=0))
                for record in records
            ),
        )
        assert await store.list_runs() == records
        for record in records:
            assert len(await store.list_events(run_id=record.run_id)) == 1

    async def test_a_bare_run_is_deleted_and_pruned_as_any(self, store: StepStore) -> None:
        await store.append_event(StepEvent(run_id='old', kind='run_completed', step_index=0, timestamp=T0))
        await store.append_event(StepEvent(run_id='gone', kind='run_started', step_index=0))
        assert await store.prune_runs(older_than=T0 + timedelta(days=1)) == ['old']
        assert await store.get_run(run_id='old') is None
        await store.delete_run(run_id='gone')
        assert await store.get_run(run_id='gone') is None
        assert await store.list_events(run_id='gone') == []
        record = await self._register(store, 'gone', agent_name='agent')
        assert await store.get_run(run_id='gone') == record
