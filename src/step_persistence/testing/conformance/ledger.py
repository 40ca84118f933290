"""The ledger of tool effects: upserts, unresolved effects, `list_tool_effects`."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from step_persistence.protocol import StepStore
from step_persistence.testing.conformance.shared import T0, ConformanceBase, _effect


class LedgerConformance(ConformanceBase):
    """The ledger of tool side effects."""

    # --- tool effects ---

    async def test_tool_effect_round_trip(self, store: StepStore) -> None:
        await self._register(store, 'fx')
        record = _effect(
            'fx',
            't1',
            'completed',
            started_at=T0,
            ended_at=T0 + timedelta(seconds=2),
            idempotency_key='mail-42',
            effect_summary='sent mail ✓',
        )
        await store.record_tool_effect(record)
        assert await store.get_tool_effect(run_id='fx', tool_call_id='t1') == record
        assert await store.get_tool_effect(run_id='fx', tool_call_id='nope') is None
        assert await store.get_tool_effect(run_id='nope', tool_call_id='t1') is None

    async def test_tool_effect_upsert_latest_wins_but_keeps_annotations(self, store: StepStore) -> None:
        await self._register(store, 'fx')
        await store.record_tool_effect(_effect('fx', 't1', started_at=T0))
        await store.record_tool_effect(_effect('fx', 't1', started_at=T0, idempotency_key='k', effect_summary='s'))
        final = _effect('fx', 't1', 'failed', started_at=T0, ended_at=T0 + timedelta(seconds=1))
        await store.record_tool_effect(final)
        stored = await store.get_tool_effect(run_id='fx', tool_call_id='t1')
        assert stored == final.model_copy(update={'idempotency_key': 'k', 'effect_summary': 's'})
        await store.record_tool_effect(final.model_copy(update={'effect_summary': 'replaced'}))
        stored = await store.get_tool_effect(run_id='fx', tool_call_id='t1')
        assert stored is not None and (stored.idempotency_key, stored.effect_summary) == ('k', 'replaced')

    async def test_tool_effects_are_keyed_per_run(self, store: StepStore) -> None:
        await self._register(store, 'a')
        await self._register(store, 'b')
        await store.record_tool_effect(_effect('a', 'same-id', 'completed'))
        await store.record_tool_effect(_effect('b', 'same-id'))
        a = await store.get_tool_effect(run_id='a', tool_call_id='same-id')
        assert a is not None and a.status == 'completed'
        assert [r.run_id for r in await store.list_unresolved_tool_effects(run_id='b')] == ['b']
        assert await store.list_unresolved_tool_effects(run_id='a') == []

    async def test_unresolved_effects_ordered_by_started_at(self, store: StepStore) -> None:
        await self._register(store, 'fx')
        for call_id, offset in [('late', 30), ('early', -30), ('middle', 0), ('done', -60)]:
            await store.record_tool_effect(_effect('fx', call_id, started_at=T0 + timedelta(seconds=offset)))
        await store.record_tool_effect(_effect('fx', 'done', 'completed', started_at=T0 - timedelta(seconds=60)))
        unresolved = await store.list_unresolved_tool_effects(run_id='fx')
        assert [r.tool_call_id for r in unresolved] == ['early', 'middle', 'late']
        assert await store.list_unresolved_tool_effects(run_id='missing') == []

    async def test_concurrent_upserts_leave_one_record(self, store: StepStore) -> None:
        await self._register(store, 'fx')
        await asyncio.gather(
            *(store.record_tool_effect(_effect('fx', 'hot', 'started', effect_summary=f's{i}')) for i in range(20))
        )
        unresolved = await store.list_unresolved_tool_effects(run_id='fx')
        assert len(unresolved) == 1 and unresolved[0].effect_summary in {f's{i}' for i in range(20)}

    async def test_list_tool_effects_lists_every_status_in_order(self, store: StepStore) -> None:
        await self._register(store, 'fx')
        await self._register(store, 'neighbour')
        await store.record_tool_effect(_effect('neighbour', 'theirs', started_at=T0 - timedelta(hours=1)))
        later = T0 + timedelta(seconds=5)
        written = [
            _effect('fx', 'late', 'failed', started_at=later, ended_at=later, effect_summary='boom'),
            _effect('fx', 'tie-b', 'completed', started_at=T0, ended_at=later),
            _effect('fx', 'tie-a', started_at=T0),
            _effect('fx', 'early', 'completed', started_at=T0 - timedelta(microseconds=1), idempotency_key='k'),
        ]
        for effect in written:
            await store.record_tool_effect(effect)
        # An upsert keeps one record per call: the latest write, with the stored annotation.
        await store.record_tool_effect(_effect('fx', 'early', 'failed', started_at=T0 - timedelta(microseconds=1)))
        early = _effect('fx', 'early', 'failed', started_at=T0 - timedelta(microseconds=1), idempotency_key='k')
        assert await store.list_tool_effects(run_id='fx') == [early, written[2], written[1], written[0]]
        assert [effect.tool_call_id for effect in await store.list_tool_effects(run_id='neighbour')] == ['theirs']
        assert await store.list_tool_effects(run_id='missing') == []
