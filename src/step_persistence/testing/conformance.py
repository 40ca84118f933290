"""One conformance suite for every `StepStore` backend (see the package docstring for use)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from step_persistence.collection import MediaCollection
from step_persistence.media.clock import REUSE_WINDOW, advanced_media_clock
from step_persistence.protocol import StepStore, write_steps
from step_persistence.records import (
    ContinuableSnapshot,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepWrites,
    ToolEffectRecord,
    utc_now,
)

__all__ = ['StepStoreConformance', 'StoreFactory', 'sample_history']

StoreFactory = Callable[..., Awaitable[StepStore]]
"""`await make_store(**options)` returns a new, empty store; options include `max_snapshots_per_run`."""

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def sample_history(turns: int = 1, *, tag: str = '') -> list[ModelMessage]:
    """A realistic history: a prompt, then `turns` tool cycles with text, binary and structured returns."""
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content=f'start {tag} ✓', timestamp=T0)])]
    for turn in range(turns):
        call_id = f'call-{tag}-{turn}'
        messages.append(
            ModelResponse(
                parts=[TextPart(content=f'thinking {turn}'), ToolCallPart('lookup', {'n': turn}, call_id)],
                timestamp=T0 + timedelta(seconds=turn),
            )
        )
        messages.append(
            ModelRequest(
                parts=[
                    ToolReturnPart(
                        'lookup',
                        {
                            'turn': turn,
                            'items': [1, 2.5, None, 'x'],
                            'image': BinaryContent(data=b'\x00\xff' * 8, media_type='image/png'),
                        }
                        if turn % 2
                        else f'result {turn}',
                        call_id,
                        timestamp=T0 + timedelta(seconds=turn),
                    )
                ]
            )
        )
    return messages


def _dump(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode='json')


def _snapshot(
    run_id: str,
    step_index: int,
    *,
    state: SnapshotState = 'complete',
    key: str | None = None,
    messages: list[ModelMessage] | None = None,
) -> ContinuableSnapshot:
    return ContinuableSnapshot(
        run_id=run_id,
        step_index=step_index,
        messages=sample_history(step_index, tag=run_id) if messages is None else messages,
        state=state,
        idempotency_key=key,
        conversation_id='conv',
        parent_run_id='parent',
        agent_name='agent',
    )


def _seqs(snapshots: list[ContinuableSnapshot]) -> list[int]:
    seqs = [snapshot.seq for snapshot in snapshots]
    assert all(seq is not None for seq in seqs), 'stores set seq on every snapshot they return'
    return [seq for seq in seqs if seq is not None]


def _effect(run_id: str, call_id: str, status: str = 'started', **fields: Any) -> ToolEffectRecord:
    return ToolEffectRecord.model_validate(
        {'run_id': run_id, 'tool_call_id': call_id, 'tool_name': 'send_mail', 'status': status, **fields}
    )


class StepStoreConformance:
    """Behaviour every `StepStore` must have. Subclasses provide the `make_store` fixture."""

    pytestmark = pytest.mark.anyio
    divergences: ClassVar[Mapping[str, str]] = {}
    """Known divergences of the backend under test: test name -> reason. They run as strict xfails."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return 'asyncio'

    @pytest.fixture(autouse=True)
    def _declared_divergence(self, request: pytest.FixtureRequest) -> None:
        reason = self.divergences.get(request.node.originalname)
        if reason is not None:
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))

    @pytest.fixture
    async def store(self, make_store: StoreFactory) -> StepStore:
        return await make_store()

    @staticmethod
    async def _register(store: StepStore, run_id: str, **fields: Any) -> RunRecord:
        record = RunRecord(run_id=run_id, **fields)
        await store.register_run(record)
        return record

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

        async def ids(**filters: str) -> list[str]:
            return [run.run_id for run in await store.list_runs(**filters)]

        assert await ids() == [f'run-{i}' for i in range(5)]
        assert await ids(parent_run_id='p1') == ['run-0', 'run-1', 'run-4']
        assert await ids(conversation_id='c1') == ['run-0', 'run-2', 'run-3']
        assert await ids(parent_run_id='p1', conversation_id='c1') == ['run-0']
        assert await ids(parent_run_id='nobody') == []

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
            StepEvent(run_id='ev', kind='run_completed', step_index=4, timestamp=T0),
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

    async def test_writes_to_unregistered_run_raise_lookup_error(self, store: StepStore) -> None:
        with pytest.raises(LookupError):
            await store.append_event(StepEvent(run_id='ghost', kind='run_started', step_index=0))
        with pytest.raises(LookupError):
            await store.save_snapshot(_snapshot('ghost', 1))
        with pytest.raises(LookupError):
            await store.record_tool_effect(_effect('ghost', 't'))
        assert await store.get_run(run_id='ghost') is None

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

    async def test_only_interrupted_snapshots_give_no_complete_one(self, store: StepStore) -> None:
        await self._register(store, 'int')
        await store.save_snapshot(_snapshot('int', 1, state='interrupted'))
        assert await store.latest_snapshot(run_id='int') is None
        assert await store.list_snapshots(run_id='int') == []

    async def test_snapshots_of_unknown_run(self, store: StepStore) -> None:
        assert await store.latest_snapshot(run_id='missing', include_interrupted=True) is None
        assert await store.list_snapshots(run_id='missing', include_interrupted=True) == []

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

    async def test_a_batch_for_an_unregistered_run_writes_nothing(self, store: StepStore) -> None:
        with pytest.raises(LookupError):
            await write_steps(
                store,
                StepWrites(
                    tool_effects=[_effect('ghost', 't')],
                    events=[StepEvent(run_id='ghost', kind='run_started', step_index=0)],
                    snapshots=[_snapshot('ghost', 1)],
                ),
            )
        assert await store.get_run(run_id='ghost') is None
        assert await store.list_events(run_id='ghost') == []

    # --- deletion ---

    async def test_delete_run_removes_everything_of_that_run_only(self, store: StepStore) -> None:
        for run_id in ('gone', 'kept'):
            await self._register(store, run_id, conversation_id='c')
            await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='k'))
            await store.save_snapshot(_snapshot(run_id, 1, key='s'))
            await store.record_tool_effect(_effect(run_id, 't'))
        await store.delete_run(run_id='gone')
        assert await store.get_run(run_id='gone') is None
        assert await store.list_events(run_id='gone') == []
        assert await store.list_snapshots(run_id='gone', include_interrupted=True) == []
        assert await store.get_tool_effect(run_id='gone', tool_call_id='t') is None
        assert [run.run_id for run in await store.list_runs(conversation_id='c')] == ['kept']
        assert len(await store.list_events(run_id='kept')) == 1
        assert len(await store.list_snapshots(run_id='kept')) == 1
        assert await store.get_tool_effect(run_id='kept', tool_call_id='t') is not None

    async def test_deleted_run_id_can_be_registered_afresh(self, store: StepStore) -> None:
        await self._register(store, 'again')
        await store.append_event(StepEvent(run_id='again', kind='run_started', step_index=0, idempotency_key='k'))
        await store.save_snapshot(_snapshot('again', 1, key='s'))
        await store.delete_run(run_id='again')
        await store.delete_run(run_id='again')
        await self._register(store, 'again')
        await store.append_event(StepEvent(run_id='again', kind='run_started', step_index=0, idempotency_key='k'))
        await store.save_snapshot(_snapshot('again', 2, key='s'))
        assert len(await store.list_events(run_id='again')) == 1
        assert [s.step_index for s in await store.list_snapshots(run_id='again')] == [2]

    async def test_delete_unknown_run_is_a_no_op(self, store: StepStore) -> None:
        await store.delete_run(run_id='never-there')

    # --- run lifecycle: list_tool_effects, delete_run(cascade=...), prune_runs ---

    @classmethod
    async def _lived(
        cls, store: StepStore, run_id: str, outcome: str, *, started_at: datetime, **fields: Any
    ) -> RunRecord:
        """Register a run with an event, a snapshot and a finished tool effect, ending as `outcome`.

        `completed`/`failed`: a terminal event. `crashed`: a tool call left `started`. `stale`: no
        terminal event and nothing since `started_at`. `running`: no terminal event, and an event
        written now (so the run is `running` however old `started_at` is).
        """
        record = await cls._register(store, run_id, started_at=started_at, **fields)
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=started_at))
        await store.save_snapshot(_snapshot(run_id, 1))
        await store.record_tool_effect(_effect(run_id, 'done', 'completed', started_at=started_at))
        later = started_at + timedelta(seconds=1)
        if outcome in ('completed', 'failed'):
            kind = 'run_completed' if outcome == 'completed' else 'run_failed'
            await store.append_event(StepEvent(run_id=run_id, kind=kind, step_index=2, timestamp=later))
        elif outcome == 'crashed':
            await store.record_tool_effect(_effect(run_id, 'pending', started_at=later))
        elif outcome == 'running':
            await store.append_event(StepEvent(run_id=run_id, kind='model_request_started', step_index=1))
        else:
            assert outcome == 'stale', outcome
        return record

    @staticmethod
    async def _assert_gone(store: StepStore, run_id: str) -> None:
        assert await store.get_run(run_id=run_id) is None
        assert run_id not in [run.run_id for run in await store.list_runs()]
        assert await store.list_events(run_id=run_id) == []
        assert await store.list_snapshots(run_id=run_id, include_interrupted=True) == []
        assert await store.latest_snapshot(run_id=run_id, include_interrupted=True) is None
        assert await store.list_tool_effects(run_id=run_id) == []
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='done') is None

    @staticmethod
    async def _assert_intact(store: StepStore, run_id: str) -> None:
        assert await store.get_run(run_id=run_id) is not None
        assert [event.kind for event in await store.list_events(run_id=run_id)][:1] == ['run_started']
        assert [snapshot.step_index for snapshot in await store.list_snapshots(run_id=run_id)] == [1]
        assert 'done' in [effect.tool_call_id for effect in await store.list_tool_effects(run_id=run_id)]

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

    async def test_delete_run_leaves_no_trace_and_spares_other_runs(self, store: StepStore) -> None:
        await self._lived(store, 'gone', 'crashed', started_at=T0, conversation_id='c')
        await self._lived(store, 'kept', 'crashed', started_at=T0, conversation_id='c', parent_run_id='gone')
        await store.delete_run(run_id='gone')
        await self._assert_gone(store, 'gone')
        await self._assert_intact(store, 'kept')
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id='kept')] == ['pending']
        assert [run.run_id for run in await store.list_runs(parent_run_id='gone')] == ['kept']
        await store.delete_run(run_id='gone')
        await self._assert_intact(store, 'kept')

    async def test_cascade_deletes_the_delegation_tree_and_nothing_else(self, store: StepStore) -> None:
        tree = {'root': None, 'child-a': 'root', 'child-b': 'root', 'grandchild': 'child-a', 'great': 'grandchild'}
        others = {'other': None, 'other-child': 'other', 'roo': None, 'sibling': 'roo', 'root-ish': 'root-'}
        for index, (run_id, parent) in enumerate([*tree.items(), *others.items()]):
            await self._lived(
                store, run_id, 'completed', started_at=T0 + timedelta(seconds=index), parent_run_id=parent
            )
        await store.delete_run(run_id='root', cascade=True)
        for run_id in tree:
            await self._assert_gone(store, run_id)
        for run_id in others:
            await self._assert_intact(store, run_id)
        assert [run.run_id for run in await store.list_runs()] == list(others)
        await store.delete_run(run_id='root', cascade=True)
        assert [run.run_id for run in await store.list_runs()] == list(others)

    async def test_delete_without_cascade_keeps_delegated_runs(self, store: StepStore) -> None:
        for index, (run_id, parent) in enumerate([('root', None), ('child', 'root'), ('grandchild', 'child')]):
            await self._lived(
                store, run_id, 'completed', started_at=T0 + timedelta(seconds=index), parent_run_id=parent
            )
        await store.delete_run(run_id='child')
        await self._assert_gone(store, 'child')
        await self._assert_intact(store, 'root')
        await self._assert_intact(store, 'grandchild')
        assert [run.run_id for run in await store.list_runs(parent_run_id='child')] == ['grandchild']
        # The chain is followed by `parent_run_id`, also from a run that is already gone.
        await store.delete_run(run_id='child', cascade=True)
        await self._assert_gone(store, 'grandchild')
        await self._assert_intact(store, 'root')

    async def test_cascade_ends_on_a_parent_cycle(self, store: StepStore) -> None:
        await self._lived(store, 'a', 'completed', started_at=T0, parent_run_id='b')
        await self._lived(store, 'b', 'completed', started_at=T0, parent_run_id='a')
        await self._lived(store, 'c', 'completed', started_at=T0, parent_run_id='b')
        await self._lived(store, 'outside', 'completed', started_at=T0)
        await store.delete_run(run_id='a', cascade=True)
        for run_id in ('a', 'b', 'c'):
            await self._assert_gone(store, run_id)
        await self._assert_intact(store, 'outside')

    async def test_prune_runs_by_age_returns_ids_oldest_first(self, store: StepStore) -> None:
        cutoff = (utc_now() - timedelta(days=7)).replace(microsecond=123456)  # mid-millisecond
        ages = {
            'middle': timedelta(days=20),
            'new': -timedelta(days=1),
            'oldest': timedelta(days=30),
            'just-before': timedelta(microseconds=1),
            'at-cutoff': timedelta(0),
        }
        for run_id, age in ages.items():
            await self._lived(store, run_id, 'completed', started_at=cutoff - age)
        await self._lived(store, 'future', 'completed', started_at=utc_now() + timedelta(days=1))
        pruned = await store.prune_runs(older_than=cutoff)
        assert pruned == ['oldest', 'middle', 'just-before']
        for run_id in pruned:
            await self._assert_gone(store, run_id)
        for run_id in ('new', 'at-cutoff', 'future'):
            await self._assert_intact(store, run_id)
        assert await store.prune_runs(older_than=cutoff) == []
        plus_two = timezone(timedelta(hours=2))
        assert await store.prune_runs(older_than=(cutoff + timedelta(microseconds=1)).astimezone(plus_two)) == [
            'at-cutoff'
        ]

    async def test_prune_runs_by_status(self, store: StepStore) -> None:
        old = utc_now() - timedelta(days=30)
        outcomes = ['completed', 'failed', 'crashed', 'stale', 'running', 'completed']
        for index, outcome in enumerate(outcomes):
            await self._lived(store, f'{outcome}-{index}', outcome, started_at=old + timedelta(minutes=index))
        cutoff = utc_now() - timedelta(days=1)
        assert await store.prune_runs(older_than=cutoff, statuses=['failed', 'crashed']) == [
            'failed-1',
            'crashed-2',
            'stale-3',
        ]
        assert await store.prune_runs(older_than=cutoff, statuses={'failed', 'crashed'}) == []
        assert await store.prune_runs(older_than=cutoff, statuses=()) == []
        for run_id in ('completed-0', 'running-4', 'completed-5'):
            await self._assert_intact(store, run_id)
        assert await store.prune_runs(older_than=cutoff, statuses=['completed']) == ['completed-0', 'completed-5']
        await self._assert_intact(store, 'running-4')

    async def test_prune_runs_never_deletes_a_running_run_unless_asked(self, store: StepStore) -> None:
        old = utc_now() - timedelta(days=30)
        await self._lived(store, 'running', 'running', started_at=old)
        await self._lived(store, 'done', 'completed', started_at=old + timedelta(seconds=1))
        await self._register(store, 'silent', started_at=old + timedelta(seconds=2))
        cutoff = utc_now() - timedelta(days=1)
        assert await store.prune_runs(older_than=cutoff, statuses=['running']) == []
        assert await store.prune_runs(older_than=cutoff) == ['done']
        await self._assert_intact(store, 'running')
        assert await store.get_run(run_id='silent') is not None
        assert await store.prune_runs(older_than=cutoff, statuses=['running'], include_running=True) == [
            'running',
            'silent',
        ]
        await self._assert_gone(store, 'running')
        assert await store.list_runs() == []

    async def test_prune_runs_rejects_bad_arguments_and_deletes_nothing(self, store: StepStore) -> None:
        await self._lived(store, 'old', 'completed', started_at=T0)
        with pytest.raises(ValueError, match='naive'):
            await store.prune_runs(older_than=datetime(2100, 1, 1))
        with pytest.raises(ValueError, match='exploded'):
            await store.prune_runs(older_than=utc_now(), statuses=['completed', 'exploded'])  # type: ignore[list-item]
        with pytest.raises(ValueError, match='string'):
            await store.prune_runs(older_than=utc_now(), statuses='completed')  # type: ignore[arg-type]
        await self._assert_intact(store, 'old')

    # --- collect_media: orphaned messages and media blobs ---

    @staticmethod
    def _payload(tag: str) -> bytes:
        """100 KiB of bytes unique to `tag`: above any media threshold."""
        return tag.encode() + bytes(range(256)) * 400

    @staticmethod
    def _media_turn(step: int, *payloads: bytes) -> list[ModelMessage]:
        """A model response and a request carrying `payloads` as binary content."""
        images = [BinaryContent(data=payload, media_type='application/octet-stream') for payload in payloads]
        return [
            ModelResponse(parts=[TextPart(content=f'look {step}')], timestamp=T0),
            ModelRequest(parts=[UserPromptPart(content=[f'see {step}', *images], timestamp=T0)]),
        ]

    async def _save_history(self, store: StepStore, run_id: str, step: int, history: list[ModelMessage]) -> None:
        await store.save_snapshot(_snapshot(run_id, step, messages=history))

    async def _assert_histories(self, store: StepStore, run_id: str, saved: Mapping[int, list[ModelMessage]]) -> None:
        """Every retained snapshot of the run reads back exactly as saved (payloads byte-identical)."""
        snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        assert snapshots, f'run {run_id!r} has no snapshots left'
        for snapshot in snapshots:
            assert _dump(snapshot.messages) == _dump(saved[snapshot.step_index])

    async def test_collect_media_rejects_a_bad_grace(self, store: StepStore) -> None:
        with pytest.raises(ValueError, match='grace'):
            await store.collect_media(grace=timedelta(seconds=-1))
        with pytest.raises(ValueError, match='grace'):
            await store.collect_media(grace=60)  # type: ignore[arg-type]

    async def test_collect_media_of_an_empty_store_reclaims_nothing(self, store: StepStore) -> None:
        assert await store.collect_media(grace=timedelta(0)) == MediaCollection(messages=0, blobs=0)

    async def test_collect_media_reclaims_unused_messages(self, make_store: StoreFactory) -> None:
        store = await make_store(max_snapshots_per_run=1)
        await self._register(store, 'r')
        start: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content='start', timestamp=T0)])]
        first = start + self._media_turn(1, self._payload('first'))
        second = start + self._media_turn(2, self._payload('second'))  # same length: the last positions change
        await self._save_history(store, 'r', 1, first)
        await self._save_history(store, 'r', 2, second)  # retention drops the first snapshot
        collected = await store.collect_media(grace=timedelta(0))
        await self._assert_histories(store, 'r', {2: second})
        assert (await store.collect_media(grace=timedelta(0))).messages == 0
        await self._save_history(store, 'r', 3, first)  # old content again: stored anew where it was reclaimed
        await self._assert_histories(store, 'r', {3: first})
        assert collected.messages >= 1

    async def test_collect_media_keeps_the_versions_retained_snapshots_use(self, make_store: StoreFactory) -> None:
        """Superseded versions that a retained snapshot still uses stay, in every run (numbers are per run)."""
        store = await make_store(max_snapshots_per_run=2)
        start: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content='start', timestamp=T0)])]
        saved: dict[str, dict[int, list[ModelMessage]]] = {}
        for run_id, turns in (('short', 1), ('long', 3)):
            await self._register(store, run_id)
            grown = start + [message for step in range(turns) for message in self._media_turn(step, b'x' * step)]
            completed = grown[:-1] + self._media_turn(turns, self._payload(f'{run_id} completed'))[1:]
            saved[run_id] = {1: grown, 2: completed}  # the newest message is replaced, as pydantic-ai does
            for step, history in saved[run_id].items():
                await self._save_history(store, run_id, step, history)
        await store.collect_media(grace=timedelta(0))
        for run_id, histories in saved.items():
            await self._assert_histories(store, run_id, histories)
            assert len(await store.list_snapshots(run_id=run_id)) == 2

    async def test_collect_media_deletes_unreferenced_blobs(self, make_store: StoreFactory) -> None:
        store = await make_store(max_snapshots_per_run=2)
        for run_id in ('keep', 'gone'):
            await self._register(store, run_id)
        shared = self._payload('shared')
        history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content='start', timestamp=T0)])]
        saved: dict[int, list[ModelMessage]] = {}
        for step in range(1, 4):
            history = history + self._media_turn(step, shared, self._payload(f'keep {step}'))
            saved[step] = history
            await self._save_history(store, 'keep', step, history)
        gone = self._media_turn(1, shared, self._payload('gone'))
        await self._save_history(store, 'gone', 1, gone)
        await store.delete_run(run_id='gone')
        collected = await store.collect_media(grace=timedelta(0))
        await self._assert_histories(store, 'keep', saved)
        assert await store.collect_media(grace=timedelta(0)) == MediaCollection(messages=0, blobs=0)
        await self._register(store, 'again')  # a deleted blob is stored again when a new message needs it
        await self._save_history(store, 'again', 1, gone)
        await self._assert_histories(store, 'again', {1: gone})
        assert collected.blobs >= 1

    async def test_collect_media_grace_keeps_recent_blobs(self, store: StepStore) -> None:
        await self._register(store, 'gone')
        await self._save_history(store, 'gone', 1, self._media_turn(1, self._payload('recent')))
        await store.delete_run(run_id='gone')
        assert (await store.collect_media(grace=timedelta(hours=1))).blobs == 0
        with advanced_media_clock(timedelta(hours=2)):
            assert (await store.collect_media(grace=timedelta(hours=1))).blobs >= 1

    async def test_collect_media_while_a_writer_reuses_and_adds_blobs(self, make_store: StoreFactory) -> None:
        """A writer saves snapshots reusing an old, unreferenced blob (and adding new ones) while
        collection runs again and again with a grace longer than `REUSE_WINDOW`; every retained
        snapshot reads back intact."""
        store = await make_store(max_snapshots_per_run=3)
        for run_id in ('old', 'live'):
            await self._register(store, run_id)
        shared = self._payload('shared')
        await self._save_history(store, 'old', 1, self._media_turn(1, shared, self._payload('old')))
        await store.delete_run(run_id='old')  # `shared` is now old news, referenced by nothing
        grace = REUSE_WINDOW + timedelta(minutes=5)
        saved: dict[int, list[ModelMessage]] = {}
        finished = asyncio.Event()

        async def write() -> None:
            history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content='start', timestamp=T0)])]
            try:
                for step in range(1, 13):
                    history = history + self._media_turn(step, shared, self._payload(f'live {step}'))
                    saved[step] = history
                    await self._save_history(store, 'live', step, history)
            finally:
                finished.set()

        async def collect() -> int:
            rounds = 0
            while not finished.is_set():
                await store.collect_media(grace=grace)
                rounds += 1
                await asyncio.sleep(0)  # let the writer run even if collecting never waits
            return rounds

        with advanced_media_clock(grace + REUSE_WINDOW):  # what was stored so far is now old
            rounds, _ = await asyncio.gather(collect(), write())
            await store.collect_media(grace=grace)
            await self._assert_histories(store, 'live', saved)
        assert rounds >= 1
        with advanced_media_clock(2 * grace + 2 * REUSE_WINDOW):
            await store.collect_media(grace=grace)
            await self._assert_histories(store, 'live', saved)

    # --- bad input ---

    async def test_naive_datetimes_are_rejected(self) -> None:
        naive = datetime(2026, 1, 1, 12, 0)
        with pytest.raises(ValueError, match='naive'):
            RunRecord(run_id='r', started_at=naive)
        with pytest.raises(ValueError, match='naive'):
            StepEvent(run_id='r', kind='run_started', step_index=0, timestamp=naive)
        with pytest.raises(ValueError, match='naive'):
            _effect('r', 't', ended_at=naive)

    async def test_unknown_literal_values_are_rejected(self) -> None:
        with pytest.raises(ValueError, match='exploded'):
            StepEvent.model_validate({'run_id': 'r', 'kind': 'exploded', 'step_index': 0})
        with pytest.raises(ValueError, match='maybe'):
            _effect('r', 't', 'maybe')
        with pytest.raises(ValueError, match='partial'):
            ContinuableSnapshot.model_validate({'run_id': 'r', 'step_index': 0, 'messages': [], 'state': 'partial'})
