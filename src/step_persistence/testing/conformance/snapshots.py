"""Snapshots and retention: continuable histories, sequence numbers, `max_snapshots_per_run`."""

from __future__ import annotations

import asyncio

import pytest
from pydantic_ai.messages import ModelRequest, UserPromptPart

from step_persistence.protocol import StepStore, SupportsSnapshotStates, snapshot_states
from step_persistence.testing.conformance.shared import (
    ConformanceBase,
    StoreFactory,
    _dump,
    _seqs,
    _snapshot,
    sample_history,
)


class SnapshotsConformance(ConformanceBase):
    """Snapshots and their retention."""

    # --- snapshots ---

    async def test_snapshot_round_trips_messages_exactly(self, store: StepStore) -> None:
        await self._register(store, 'snap')
        saved = _snapshot('snap', 3)
        await store.save_snapshot(saved)
        latest = await store.latest_snapshot(run_id='snap')
        assert latest is not None
        assert _dump(latest.messages) == _dump(saved.messages)
        assert latest.model_dump(exclude={'messages', 'seq', 'timestamp'}) == saved.model_dump(
            exclude={'messages', 'seq', 'timestamp'}
        )
        assert latest.timestamp == saved.timestamp
        assert latest.seq is not None
        assert latest == saved, 'a snapshot read back equals the one saved (seq, assigned by the store, aside)'
        assert [await store.latest_snapshot(run_id='snap')] == await store.list_snapshots(run_id='snap')

    async def test_snapshot_is_a_copy_of_the_history(self, store: StepStore) -> None:
        await self._register(store, 'copy')
        messages = sample_history(2)
        expected = _dump(messages)
        await store.save_snapshot(_snapshot('copy', 2, messages=messages))
        first = messages[0]
        assert isinstance(first, ModelRequest)
        first.parts = [*first.parts, UserPromptPart(content='added later')]
        messages.append(ModelRequest(parts=[UserPromptPart(content='appended later')]))
        latest = await store.latest_snapshot(run_id='copy')
        assert latest is not None
        assert _dump(latest.messages) == expected

    async def test_sequence_numbers_increase_per_run(self, store: StepStore) -> None:
        await self._register(store, 'a')
        await self._register(store, 'b')
        for step in (5, 1, 3):
            await store.save_snapshot(_snapshot('a', step))
            await store.save_snapshot(_snapshot('b', step))
        for run_id in ('a', 'b'):
            snapshots = await store.list_snapshots(run_id=run_id)
            seqs = _seqs(snapshots)
            assert [snapshot.step_index for snapshot in snapshots] == [5, 1, 3]
            assert seqs == sorted(seqs) and len(set(seqs)) == 3
            assert all(snapshot.run_id == run_id for snapshot in snapshots)

    async def test_concurrent_saves_never_collide(self, store: StepStore) -> None:
        await self._register(store, 'busy')
        await asyncio.gather(*(store.save_snapshot(_snapshot('busy', step % 4)) for step in range(50)))
        snapshots = await store.list_snapshots(run_id='busy')
        seqs = _seqs(snapshots)
        assert len(snapshots) == 50
        assert len(set(seqs)) == 50 and seqs == sorted(seqs)

    async def test_latest_and_list_respect_state(self, store: StepStore) -> None:
        await self._register(store, 'st')
        assert await store.latest_snapshot(run_id='st') is None
        assert await store.latest_snapshot(run_id='st', include_interrupted=True) is None
        await store.save_snapshot(_snapshot('st', 1))
        await store.save_snapshot(_snapshot('st', 2))
        await store.save_snapshot(_snapshot('st', 3, state='interrupted'))
        complete = await store.latest_snapshot(run_id='st')
        newest = await store.latest_snapshot(run_id='st', include_interrupted=True)
        assert complete is not None and (complete.step_index, complete.state) == (2, 'complete')
        assert newest is not None and (newest.step_index, newest.state) == (3, 'interrupted')
        assert [s.step_index for s in await store.list_snapshots(run_id='st')] == [1, 2]
        assert [s.step_index for s in await store.list_snapshots(run_id='st', include_interrupted=True)] == [1, 2, 3]
        await self._states_are(store, 'st', ['complete', 'complete', 'interrupted'])

    async def _states_are(self, store: StepStore, run_id: str, states: list[str]) -> None:
        """The run's snapshot states are `states`: those of `list_snapshots`, what `snapshot_states` reads, and
        what `list_snapshot_states` reads where the store has it."""
        listed = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        assert [snapshot.state for snapshot in listed] == states
        assert await snapshot_states(store, run_id=run_id) == states
        if isinstance(store, SupportsSnapshotStates):
            assert await store.list_snapshot_states(run_id=run_id) == states

    async def test_only_interrupted_snapshots_give_no_complete_one(self, store: StepStore) -> None:
        await self._register(store, 'int')
        await store.save_snapshot(_snapshot('int', 1, state='interrupted'))
        assert await store.latest_snapshot(run_id='int') is None
        assert await store.list_snapshots(run_id='int') == []

    async def test_snapshots_of_unknown_run(self, store: StepStore) -> None:
        assert await store.latest_snapshot(run_id='missing', include_interrupted=True) is None
        assert await store.list_snapshots(run_id='missing', include_interrupted=True) == []
        await self._states_are(store, 'missing', [])

    async def test_snapshot_idempotency_key_is_a_no_op_when_repeated(self, store: StepStore) -> None:
        await self._register(store, 'idem')
        await self._register(store, 'other')
        await store.save_snapshot(_snapshot('idem', 1, key='step-1'))
        await store.save_snapshot(_snapshot('idem', 2, key='step-1'))
        await store.save_snapshot(_snapshot('other', 7, key='step-1'))
        assert [s.step_index for s in await store.list_snapshots(run_id='idem')] == [1]
        assert [s.step_index for s in await store.list_snapshots(run_id='other')] == [7]

    async def test_snapshot_key_stays_used_after_pruning(self, make_store: StoreFactory) -> None:
        store = await make_store(max_snapshots_per_run=1)
        await self._register(store, 'pruned')
        await store.save_snapshot(_snapshot('pruned', 1, key='k1'))
        await store.save_snapshot(_snapshot('pruned', 2, key='k2'))
        await store.save_snapshot(_snapshot('pruned', 3, key='k3'))
        await store.save_snapshot(_snapshot('pruned', 1, key='k1'))
        snapshots = await store.list_snapshots(run_id='pruned', include_interrupted=True)
        assert [s.step_index for s in snapshots] == [3]

    @pytest.mark.parametrize(
        ('limit', 'states', 'kept'),
        [
            (2, 'ccccc', [4, 5]),
            (1, 'cci', [2, 3]),
            (2, 'ciii', [1, 3, 4]),
            (3, 'iciii', [2, 3, 4, 5]),
            (1, 'iii', [3]),
            (5, 'cic', [1, 2, 3]),
        ],
    )
    async def test_retention_keeps_newest_n_newest_and_newest_complete(
        self, make_store: StoreFactory, limit: int, states: str, kept: list[int]
    ) -> None:
        store = await make_store(max_snapshots_per_run=limit)
        await self._register(store, 'ret')
        await self._register(store, 'neighbour')
        await store.save_snapshot(_snapshot('neighbour', 0))
        for step, state in enumerate(states, start=1):
            await store.save_snapshot(_snapshot('ret', step, state='complete' if state == 'c' else 'interrupted'))
        retained = await store.list_snapshots(run_id='ret', include_interrupted=True)
        assert [s.step_index for s in retained] == kept
        await self._states_are(
            store, 'ret', ['complete' if states[step - 1] == 'c' else 'interrupted' for step in kept]
        )
        newest = await store.latest_snapshot(run_id='ret', include_interrupted=True)
        assert newest is not None and newest.step_index == len(states)
        complete_steps = [step for step, state in enumerate(states, start=1) if state == 'c']
        latest_complete = await store.latest_snapshot(run_id='ret')
        assert (latest_complete.step_index if latest_complete else None) == (
            complete_steps[-1] if complete_steps else None
        )
        assert len(await store.list_snapshots(run_id='neighbour')) == 1

    async def test_retention_under_concurrent_saves(self, make_store: StoreFactory) -> None:
        store = await make_store(max_snapshots_per_run=3)
        await self._register(store, 'crowd')
        await asyncio.gather(
            *(
                store.save_snapshot(_snapshot('crowd', i, state='interrupted' if i % 2 else 'complete'))
                for i in range(30)
            )
        )
        retained = await store.list_snapshots(run_id='crowd', include_interrupted=True)
        assert 3 <= len(retained) <= 4
        seqs = _seqs(retained)
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert await store.latest_snapshot(run_id='crowd') is not None

    @pytest.mark.parametrize('bad', [0, -1, 1.5, '2', True, 2.0])
    async def test_invalid_retention_limit_is_rejected(self, make_store: StoreFactory, bad: object) -> None:
        with pytest.raises(ValueError, match='max_snapshots_per_run'):
            await make_store(max_snapshots_per_run=bad)
