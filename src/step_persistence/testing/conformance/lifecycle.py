"""Run lifecycle: `delete_run` (with and without cascade), `prune_runs`, `collect_media`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_persistence.media.clock import REUSE_WINDOW, advanced_media_clock
from step_persistence.protocol import StepStore
from step_persistence.reclaiming import MediaCollection
from step_persistence.records import RunRecord, StepEvent, utc_now
from step_persistence.testing.conformance.shared import T0, ConformanceBase, StoreFactory, _dump, _effect, _snapshot


class LifecycleConformance(ConformanceBase):
    """Deleting, pruning and collecting media."""

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

    # --- run lifecycle: delete_run(cascade=...), prune_runs ---

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
