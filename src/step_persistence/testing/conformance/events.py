"""Events: the append-only log and its idempotency keys."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from step_persistence.protocol import StepStore
from step_persistence.records import TOKEN_COUNT_MAX, StepEvent, TokenUsage
from step_persistence.testing.conformance.shared import T0, ConformanceBase


class EventsConformance(ConformanceBase):
    """The event log."""

    # --- events ---

    async def test_events_round_trip_in_append_order(self, store: StepStore) -> None:
        await self._register(store, 'ev')
        events = [
            StepEvent(run_id='ev', kind='run_started', step_index=0, timestamp=T0, metadata={'k': 'v'}),
            StepEvent(
                run_id='ev',
                kind='tool_call_failed',
                step_index=3,
                timestamp=T0 - timedelta(hours=1),
                conversation_id='c',
                parent_run_id='p',
                agent_name='a',
                tool_call_id='t1',
                tool_name='mail',
                error="RuntimeError('boom')",
                idempotency_key='k1',
            ),
            StepEvent(
                run_id='ev',
                kind='model_request_completed',
                step_index=4,
                timestamp=T0,
                model_name='gpt-5.2 \u00e9\n',
                usage=TokenUsage(input_tokens=1200, output_tokens=0, cache_read_tokens=1024, cache_write_tokens=7),
            ),
            StepEvent(
                run_id='ev',
                kind='model_request_failed',
                step_index=5,
                timestamp=T0,
                error='cut short',
                model_name='',
                usage=TokenUsage(
                    input_tokens=TOKEN_COUNT_MAX,
                    output_tokens=TOKEN_COUNT_MAX,
                    cache_read_tokens=0,
                    cache_write_tokens=0,
                ),
            ),
            StepEvent(run_id='ev', kind='model_request_completed', step_index=6, timestamp=T0, model_name='unmetered'),
            StepEvent(run_id='ev', kind='run_completed', step_index=6, timestamp=T0),
        ]
        for event in events:
            await store.append_event(event)
        assert await store.list_events(run_id='ev') == events

    async def test_event_idempotency_key_suppresses_exact_repeats_per_run(self, store: StepStore) -> None:
        await self._register(store, 'a')
        await self._register(store, 'b')
        first = StepEvent(run_id='a', kind='run_started', step_index=0, idempotency_key='k')
        await store.append_event(first)
        await store.append_event(StepEvent(run_id='a', kind='run_failed', step_index=9, idempotency_key='k'))
        await store.append_event(StepEvent(run_id='a', kind='run_completed', step_index=1, idempotency_key='K'))
        await store.append_event(StepEvent(run_id='b', kind='run_started', step_index=0, idempotency_key='k'))
        unkeyed = StepEvent(run_id='a', kind='model_request_started', step_index=1)
        await store.append_event(unkeyed)
        await store.append_event(unkeyed)
        assert [(e.kind, e.idempotency_key) for e in await store.list_events(run_id='a')] == [
            ('run_started', 'k'),
            ('run_completed', 'K'),
            ('model_request_started', None),
            ('model_request_started', None),
        ]
        assert len(await store.list_events(run_id='b')) == 1

    async def test_concurrent_appends_with_one_key_write_once(self, store: StepStore) -> None:
        await self._register(store, 'ev')
        await asyncio.gather(
            *(
                store.append_event(StepEvent(run_id='ev', kind='run_started', step_index=i, idempotency_key='once'))
                for i in range(20)
            )
        )
        assert len(await store.list_events(run_id='ev')) == 1

    async def test_events_of_unknown_run_are_empty(self, store: StepStore) -> None:
        assert await store.list_events(run_id='missing') == []
