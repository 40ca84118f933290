"""Batches: `write_steps` with effects, events and snapshots in one call."""

from __future__ import annotations

from datetime import timedelta

from step_persistence.protocol import StepStore, write_steps
from step_persistence.records import RunRecord, StepEvent, StepWrites
from step_persistence.testing.conformance.shared import T0, ConformanceBase, _effect, _snapshot


class BatchesConformance(ConformanceBase):
    """Batched step writes."""

    # --- batches ---

    async def test_a_batch_has_the_effect_of_its_calls_in_order(self, store: StepStore) -> None:
        await self._register(store, 'batch')
        await store.record_tool_effect(_effect('batch', 'annotated', idempotency_key='k', effect_summary='s'))
        await store.append_event(StepEvent(run_id='batch', kind='run_started', step_index=0, idempotency_key='seen'))
        await write_steps(
            store,
            StepWrites(
                tool_effects=[
                    _effect('batch', 'annotated', 'completed'),
                    _effect('batch', 'fresh'),
                    _effect('batch', 'fresh', 'failed'),
                ],
                events=[
                    StepEvent(run_id='batch', kind='run_failed', step_index=9, idempotency_key='seen'),
                    StepEvent(run_id='batch', kind='tool_call_started', step_index=1, tool_call_id='fresh'),
                    StepEvent(run_id='batch', kind='tool_call_failed', step_index=1, idempotency_key='new'),
                    StepEvent(run_id='batch', kind='run_failed', step_index=1, idempotency_key='new'),
                ],
                snapshots=[_snapshot('batch', 1, key='snap'), _snapshot('batch', 3, state='interrupted')],
            ),
        )
        await write_steps(store, StepWrites(snapshots=[_snapshot('batch', 2, key='snap')]))
        annotated = await store.get_tool_effect(run_id='batch', tool_call_id='annotated')
        assert annotated is not None
        assert (annotated.status, annotated.idempotency_key, annotated.effect_summary) == ('completed', 'k', 's')
        fresh = await store.get_tool_effect(run_id='batch', tool_call_id='fresh')
        assert fresh is not None and fresh.status == 'failed'
        assert [event.kind for event in await store.list_events(run_id='batch')] == [
            'run_started',
            'tool_call_started',
            'tool_call_failed',
        ]
        assert [s.step_index for s in await store.list_snapshots(run_id='batch', include_interrupted=True)] == [1, 3]

    async def test_a_batch_may_span_runs(self, store: StepStore) -> None:
        for run_id in ('left', 'right'):
            await self._register(store, run_id)
        await write_steps(
            store,
            StepWrites(
                tool_effects=[_effect('left', 'a'), _effect('right', 'b', 'completed')],
                events=[StepEvent(run_id=run_id, kind='run_started', step_index=0) for run_id in ('right', 'left')],
                snapshots=[_snapshot('left', 1), _snapshot('right', 2)],
            ),
        )
        for run_id, call_id, step in (('left', 'a', 1), ('right', 'b', 2)):
            assert [effect.tool_call_id for effect in await store.list_tool_effects(run_id=run_id)] == [call_id]
            assert [event.kind for event in await store.list_events(run_id=run_id)] == ['run_started']
            latest = await store.latest_snapshot(run_id=run_id)
            assert latest is not None and latest.step_index == step

    async def test_a_batch_registers_its_unknown_run_bare_at_its_first_write(self, store: StepStore) -> None:
        writes = StepWrites(
            tool_effects=[_effect('ghost', 't', started_at=T0 + timedelta(seconds=5))],
            events=[StepEvent(run_id='ghost', kind='run_started', step_index=0, timestamp=T0)],
            snapshots=[_snapshot('ghost', 1)],
        )
        await write_steps(store, writes)
        assert await store.get_run(run_id='ghost') == RunRecord(run_id='ghost', started_at=T0 + timedelta(seconds=5))
        assert await store.list_events(run_id='ghost') == writes.events
        assert await store.list_snapshots(run_id='ghost') == writes.snapshots
        assert await store.list_tool_effects(run_id='ghost') == writes.tool_effects
