"""Conversations: origins and their kinds, histories shared across runs, listing and finding by conversation."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_persistence.conversations import continue_conversation, delete_conversation
from step_persistence.copying import copy_runs
from step_persistence.helpers import continue_run, fork_run
from step_persistence.protocol import StepStore
from step_persistence.records import ContinuableSnapshot, RunOrigin, SnapshotRef
from step_persistence.testing.conformance.shared import T0, ConformanceBase, StoreFactory, _dump

__all__ = ['ConversationsConformance', 'chat_history']


def chat_history(turns: int, *, tag: str = '', start: int = 0) -> list[ModelMessage]:
    """`turns` exchanges (a prompt, then an answer), numbered from `start`; `tag` tells branches apart."""
    messages: list[ModelMessage] = []
    for turn in range(start, start + turns):
        at = T0 + timedelta(minutes=turn)
        messages.append(ModelRequest(parts=[UserPromptPart(content=f'question {turn}{tag}', timestamp=at)]))
        messages.append(ModelResponse(parts=[TextPart(content=f'answer {turn}{tag} ✓')], timestamp=at))
    return messages


def _saved(run_id: str, step: int, messages: list[ModelMessage], **fields: Any) -> ContinuableSnapshot:
    fields.setdefault('conversation_id', 'conv')
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages, **fields)


def _origin(run_id: str, seq: int, kind: str = 'continued') -> RunOrigin:
    return RunOrigin.model_validate({'kind': kind, 'run_id': run_id, 'seq': seq})


class ConversationsConformance(ConformanceBase):
    """Runs that continue or fork stored snapshots, and the conversations they make up."""

    async def _turn(
        self,
        store: StepStore,
        run_id: str,
        history: list[ModelMessage],
        *,
        origin: RunOrigin | None,
        conversation_id: str = 'conv',
        **fields: Any,
    ) -> None:
        """Register `run_id` continuing `origin` and save `history` as its one snapshot."""
        await self._register(store, run_id, conversation_id=conversation_id, origin=origin, **fields)
        await store.save_snapshot(_saved(run_id, 1, history, conversation_id=conversation_id))

    async def _chat(self, store: StepStore, turns: int, *, prefix: str = 'turn') -> list[list[ModelMessage]]:
        """A conversation of `turns` runs, each continuing the previous run's snapshot; their histories."""
        histories: list[list[ModelMessage]] = []
        for turn in range(turns):
            history = chat_history(turn + 1)
            origin = None if turn == 0 else _origin(f'{prefix}-{turn - 1}', 1)
            await self._turn(store, f'{prefix}-{turn}', history, origin=origin, started_at=T0 + timedelta(minutes=turn))
            histories.append(history)
        return histories

    async def _assert_reads(self, store: StepStore, run_id: str, *histories: list[ModelMessage]) -> None:
        stored = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        assert [_dump(snapshot.messages) for snapshot in stored] == [_dump(history) for history in histories]

    # --- origins ---

    async def test_origin_round_trips(self, store: StepStore) -> None:
        await self._register(store, 'first', conversation_id='conv')
        await store.save_snapshot(_saved('first', 1, chat_history(1)))
        record = await self._register(store, 'next', conversation_id='conv', origin=_origin('first', 1))
        assert await store.get_run(run_id='next') == record
        assert (await store.get_run(run_id='first')).origin is None  # type: ignore[union-attr]
        assert [r.origin for r in await store.list_runs(conversation_id='conv')] == [None, record.origin]

    async def test_a_second_continuation_of_one_snapshot_is_stored_as_a_fork(self, store: StepStore) -> None:
        await self._register(store, 'head', conversation_id='conv')
        await store.save_snapshot(_saved('head', 1, chat_history(1)))
        await self._register(store, 'tab-1', origin=_origin('head', 1))
        await self._register(store, 'tab-2', origin=_origin('head', 1))
        await self._register(store, 'branch', origin=_origin('head', 1, 'forked'))
        kinds = {run_id: (await store.get_run(run_id=run_id)).origin for run_id in ('tab-1', 'tab-2', 'branch')}  # type: ignore[union-attr]
        assert kinds == {
            'tab-1': _origin('head', 1),
            'tab-2': _origin('head', 1, 'forked'),
            'branch': _origin('head', 1, 'forked'),
        }

    async def test_concurrent_continuations_store_exactly_one_continued(self, store: StepStore) -> None:
        await self._register(store, 'head', conversation_id='conv')
        await store.save_snapshot(_saved('head', 1, chat_history(1)))
        tabs = [f'tab-{n}' for n in range(6)]
        await asyncio.gather(*(self._register(store, tab, origin=_origin('head', 1)) for tab in tabs))
        kinds = [(await store.get_run(run_id=tab)).origin.kind for tab in tabs]  # type: ignore[union-attr]
        assert sorted(kinds) == ['continued'] + ['forked'] * 5

    async def test_the_continuation_of_a_deleted_run_frees_its_snapshot(self, store: StepStore) -> None:
        await self._register(store, 'head', conversation_id='conv')
        await store.save_snapshot(_saved('head', 1, chat_history(1)))
        await self._register(store, 'tab-1', origin=_origin('head', 1))
        await store.delete_run(run_id='tab-1')
        await self._register(store, 'tab-2', origin=_origin('head', 1))
        assert (await store.get_run(run_id='tab-2')).origin == _origin('head', 1)  # type: ignore[union-attr]

    # --- histories shared across runs ---

    async def test_each_turn_of_a_chat_reads_back_exactly(self, store: StepStore) -> None:
        histories = await self._chat(store, 6)
        for turn, history in enumerate(histories):
            await self._assert_reads(store, f'turn-{turn}', history)
        latest = await store.latest_snapshot(run_id='turn-5')
        assert latest is not None and _dump(latest.messages) == _dump(histories[-1])

    async def test_a_run_saving_several_snapshots_on_a_continued_history(self, store: StepStore) -> None:
        await self._chat(store, 2)
        await self._register(store, 'long', conversation_id='conv', origin=_origin('turn-1', 1))
        steps = [chat_history(2 + extra) for extra in range(1, 5)]
        for step, history in enumerate(steps, start=1):
            await store.save_snapshot(_saved('long', step, history))
        await self._assert_reads(store, 'long', *steps)

    async def test_deleting_earlier_turns_keeps_later_histories(self, store: StepStore) -> None:
        histories = await self._chat(store, 5)
        for turn in (0, 2, 1):
            await store.delete_run(run_id=f'turn-{turn}')
        await store.collect_media(grace=timedelta(0))
        for turn in (3, 4):
            await self._assert_reads(store, f'turn-{turn}', histories[turn])

    async def test_deleting_the_latest_turn_keeps_the_earlier_ones(self, store: StepStore) -> None:
        histories = await self._chat(store, 4)
        await store.delete_run(run_id='turn-3')
        await store.collect_media(grace=timedelta(0))
        for turn in range(3):
            await self._assert_reads(store, f'turn-{turn}', histories[turn])
        following = chat_history(4, tag='-again')[:6] + chat_history(1, tag='-again', start=3)
        await self._turn(store, 'again', following, origin=_origin('turn-2', 1))
        await self._assert_reads(store, 'again', following)

    async def test_pruning_old_turns_keeps_later_histories(self, store: StepStore) -> None:
        histories = await self._chat(store, 4)
        cutoff = (await store.get_run(run_id='turn-3')).started_at  # type: ignore[union-attr]
        pruned = await store.prune_runs(older_than=cutoff, include_running=True)
        assert pruned == ['turn-0', 'turn-1', 'turn-2']
        await store.collect_media(grace=timedelta(0))
        await self._assert_reads(store, 'turn-3', histories[3])

    async def test_retention_of_the_origin_run_keeps_its_continuations(self, make_store: StoreFactory) -> None:
        store = await make_store(max_snapshots_per_run=1)
        await self._register(store, 'first', conversation_id='conv')
        await store.save_snapshot(_saved('first', 1, chat_history(1)))
        continued = chat_history(2)
        await self._turn(store, 'next', continued, origin=_origin('first', 1))
        for step in range(2, 5):
            await store.save_snapshot(_saved('first', step, chat_history(step, tag='-first')))
        await store.collect_media(grace=timedelta(0))
        await self._assert_reads(store, 'next', continued)
        await self._assert_reads(store, 'first', chat_history(4, tag='-first'))

    async def test_a_fork_from_an_early_snapshot_and_the_run_going_on(self, store: StepStore) -> None:
        await self._register(store, 'main', conversation_id='conv')
        steps = [chat_history(n) for n in range(1, 4)]
        for step, history in enumerate(steps, start=1):
            await store.save_snapshot(_saved('main', step, history))
        fork = chat_history(1) + chat_history(2, tag='-fork', start=1)
        await self._turn(store, 'fork', fork, origin=_origin('main', 1, 'forked'))
        later = chat_history(5)
        await store.save_snapshot(_saved('main', 4, later))
        fork_later = fork + chat_history(1, tag='-fork', start=3)
        await store.save_snapshot(_saved('fork', 2, fork_later))
        await self._assert_reads(store, 'main', *steps, later)
        await self._assert_reads(store, 'fork', fork, fork_later)

    async def test_two_tabs_writing_in_turn_from_one_head(self, store: StepStore) -> None:
        await self._chat(store, 2)
        base = chat_history(2)
        written: dict[str, list[list[ModelMessage]]] = {'tab-a': [], 'tab-b': []}
        for tab in written:
            await self._register(store, tab, conversation_id='conv', origin=_origin('turn-1', 1))
        for step in range(1, 4):
            for tab in written:
                history = base + chat_history(step, tag=f'-{tab}', start=2)
                await store.save_snapshot(_saved(tab, step, history))
                written[tab].append(history)
        for tab, histories in written.items():
            await self._assert_reads(store, tab, *histories)

    async def test_two_tabs_writing_at_once_from_one_head(self, store: StepStore) -> None:
        await self._chat(store, 2)
        base = chat_history(2)
        tabs = [f'tab-{n}' for n in range(4)]
        for tab in tabs:
            await self._register(store, tab, conversation_id='conv', origin=_origin('turn-1', 1))

        async def write(tab: str) -> list[list[ModelMessage]]:
            histories = [base + chat_history(step, tag=f'-{tab}', start=2) for step in range(1, 4)]
            for step, history in enumerate(histories, start=1):
                await store.save_snapshot(_saved(tab, step, history))
            return histories

        for tab, histories in zip(tabs, await asyncio.gather(*(write(tab) for tab in tabs)), strict=True):
            await self._assert_reads(store, tab, *histories)

    async def test_a_history_that_differs_from_its_origin_is_stored_as_it_is(self, store: StepStore) -> None:
        await self._register(store, 'first', conversation_id='conv')
        await store.save_snapshot(_saved('first', 1, chat_history(3)))
        rewritten = chat_history(1, tag='-edited') + chat_history(2, start=1) + chat_history(1, start=3)
        await self._turn(store, 'edited', rewritten, origin=_origin('first', 1))
        shorter = chat_history(1)
        await self._turn(store, 'shorter', shorter, origin=_origin('first', 1, 'forked'))
        await self._assert_reads(store, 'edited', rewritten)
        await self._assert_reads(store, 'shorter', shorter)
        await self._assert_reads(store, 'first', chat_history(3))

    async def test_an_origin_that_is_not_stored_is_kept_as_lineage(self, store: StepStore) -> None:
        history = chat_history(2)
        await self._turn(store, 'orphan', history, origin=_origin('never-stored', 7))
        assert (await store.get_run(run_id='orphan')).origin == _origin('never-stored', 7)  # type: ignore[union-attr]
        await self._assert_reads(store, 'orphan', history)

    async def test_a_deleted_origin_run_registered_again_shares_nothing(self, store: StepStore) -> None:
        histories = await self._chat(store, 2)
        await store.delete_run(run_id='turn-0')
        other = chat_history(1, tag='-other')
        await self._turn(store, 'turn-0', other, origin=None)
        await store.collect_media(grace=timedelta(0))
        await self._assert_reads(store, 'turn-0', other)
        await self._assert_reads(store, 'turn-1', histories[1])

    async def test_copy_runs_keeps_origins_and_histories(self, store: StepStore, make_store: StoreFactory) -> None:
        histories = await self._chat(store, 4)
        target = await make_store()
        await copy_runs(store, target)
        for turn, history in enumerate(histories):
            assert await target.get_run(run_id=f'turn-{turn}') == await store.get_run(run_id=f'turn-{turn}')
            await self._assert_reads(target, f'turn-{turn}', history)

    async def test_copy_runs_translates_an_origin_to_the_destination_numbers(self, make_store: StoreFactory) -> None:
        source = await make_store(max_snapshots_per_run=2)
        await self._register(source, 'first', conversation_id='conv', started_at=T0)
        for step in range(1, 5):
            await source.save_snapshot(_saved('first', step, chat_history(step)))
        continued = chat_history(5)
        await self._turn(source, 'next', continued, origin=_origin('first', 4), started_at=T0 + timedelta(1))
        await self._turn(source, 'lost', continued, origin=_origin('first', 1, 'forked'), started_at=T0 + timedelta(2))
        target = await make_store()
        assert (await copy_runs(source, target)).ok
        assert [snapshot.seq for snapshot in await target.list_snapshots(run_id='first')] == [1, 2]
        assert (await target.get_run(run_id='next')).origin == _origin('first', 2)  # type: ignore[union-attr]
        # Snapshot 1 was pruned at the source: the origin stays as the source recorded it.
        assert (await target.get_run(run_id='lost')).origin == _origin('first', 1, 'forked')  # type: ignore[union-attr]
        await self._assert_reads(target, 'next', continued)
        assert (await copy_runs(source, target)).skipped == ['first', 'next', 'lost']

    # --- finding a kept history ---

    async def test_find_snapshot_by_history(self, store: StepStore) -> None:
        await self._register(store, 'a', conversation_id='conv')
        first = _saved('a', 1, chat_history(1))
        await store.save_snapshot(first)
        await store.save_snapshot(_saved('a', 2, chat_history(2)))
        await store.save_snapshot(_saved('a', 3, chat_history(1)))  # the same history again, newer
        await self._register(store, 'elsewhere', conversation_id='other')
        await store.save_snapshot(_saved('elsewhere', 1, chat_history(1), conversation_id='other'))
        digest = first.history_digest()
        assert await store.find_snapshot(conversation_id='conv', history_digest=digest) == SnapshotRef(
            run_id='a', seq=3
        )
        assert await store.find_snapshot(conversation_id='other', history_digest=digest) == SnapshotRef(
            run_id='elsewhere', seq=1
        )
        assert await store.find_snapshot(conversation_id='none', history_digest=digest) is None
        unknown = _saved('a', 9, chat_history(3)).history_digest()
        assert await store.find_snapshot(conversation_id='conv', history_digest=unknown) is None

    async def test_find_snapshot_prefers_the_newest_run(self, store: StepStore) -> None:
        for run_id in ('old', 'new'):
            await self._register(store, run_id, conversation_id='conv')
            await store.save_snapshot(_saved(run_id, 1, chat_history(2)))
        digest = _saved('x', 1, chat_history(2)).history_digest()
        assert await store.find_snapshot(conversation_id='conv', history_digest=digest) == SnapshotRef(
            run_id='new', seq=1
        )
        await store.delete_run(run_id='new')
        assert await store.find_snapshot(conversation_id='conv', history_digest=digest) == SnapshotRef(
            run_id='old', seq=1
        )

    # --- listing ---

    async def test_list_runs_filters_by_agent_and_origin(self, store: StepStore) -> None:
        await self._register(store, 'a', agent_name='writer', conversation_id='conv', started_at=T0)
        await store.save_snapshot(_saved('a', 1, chat_history(1)))
        await self._register(store, 'b', agent_name='writer', origin=_origin('a', 1), started_at=T0 + timedelta(1))
        await self._register(store, 'c', agent_name='reader', origin=_origin('a', 1), started_at=T0 + timedelta(2))

        async def ids(**filters: Any) -> list[str]:
            return [run.run_id for run in await store.list_runs(**filters)]

        assert await ids(agent_name='writer') == ['a', 'b']
        assert await ids(origin_run_id='a') == ['b', 'c']
        assert await ids(origin_run_id='a', agent_name='reader') == ['c']
        assert await ids(agent_name='nobody') == []

    async def test_list_runs_newest_first_and_limit(self, store: StepStore) -> None:
        for n in range(5):
            await self._register(store, f'r{n}', conversation_id='conv', started_at=T0 + timedelta(minutes=n % 3))

        async def ids(**options: Any) -> list[str]:
            return [run.run_id for run in await store.list_runs(**options)]

        assert await ids() == ['r0', 'r3', 'r1', 'r4', 'r2']
        assert await ids(newest_first=True) == ['r2', 'r4', 'r1', 'r3', 'r0']
        assert await ids(newest_first=True, limit=2) == ['r2', 'r4']
        assert await ids(limit=3, conversation_id='conv') == ['r0', 'r3', 'r1']
        assert await ids(limit=50) == ['r0', 'r3', 'r1', 'r4', 'r2']

    async def test_list_runs_by_run_id_prefix(self, store: StepStore) -> None:
        layout = [('run-a1', 'writer'), ('run-a2', 'reader'), ('RUN-a3', 'writer'), ('run_b', 'writer')]
        layout += [('runXb', 'writer'), ('run.c', 'reader'), ('ru', 'writer')]
        for minute, (run_id, agent) in enumerate(layout):
            await self._register(store, run_id, agent_name=agent, started_at=T0 + timedelta(minutes=minute))

        async def ids(**filters: Any) -> list[str]:
            return [run.run_id for run in await store.list_runs(**filters)]

        assert await ids(run_id_prefix='run-a') == ['run-a1', 'run-a2']  # case-sensitive: not RUN-a3
        assert await ids(run_id_prefix='run_') == ['run_b']  # `_` is a character, not a wildcard
        assert await ids(run_id_prefix='run.') == ['run.c']
        assert await ids(run_id_prefix='run-a1') == ['run-a1']
        assert await ids(run_id_prefix='run-a10') == []
        assert await ids(run_id_prefix='') == [run_id for run_id, _ in layout]
        assert await ids(run_id_prefix='ru', agent_name='writer', newest_first=True, limit=3) == [
            'ru',
            'runXb',
            'run_b',
        ]
        with pytest.raises(TypeError):
            await store.list_runs(run_id_prefix=7)  # type: ignore[arg-type]

    async def test_list_runs_by_run_id_prefix_of_any_text(self, store: StepStore) -> None:
        layout = ['50%-off', '50x-off', 'ñandú', 'ña', 'Ña', 'a\U0010ffffz', 'a\U0010ffff', 'b']
        for minute, run_id in enumerate(layout):
            await self._register(store, run_id, started_at=T0 + timedelta(minutes=minute))

        async def ids(prefix: str) -> list[str]:
            return [run.run_id for run in await store.list_runs(run_id_prefix=prefix)]

        assert await ids('50%') == ['50%-off']  # `%` is a character, not a wildcard
        assert await ids('ña') == ['ñandú', 'ña']  # not 'Ña'
        assert await ids('Ña') == ['Ña']
        assert await ids('ñan') == ['ñandú']
        assert await ids('a\U0010ffff') == ['a\U0010ffffz', 'a\U0010ffff']
        assert await ids('a') == ['a\U0010ffffz', 'a\U0010ffff']

    @pytest.mark.parametrize(
        ('limit', 'error'), [(0, ValueError), (-1, ValueError), ('5', TypeError), (True, TypeError)]
    )
    async def test_list_runs_refuses_a_bad_limit(self, store: StepStore, limit: object, error: type[Exception]) -> None:
        with pytest.raises(error):
            await store.list_runs(limit=limit)  # type: ignore[arg-type]
        with pytest.raises(error):
            await store.list_conversations(limit=limit)  # type: ignore[arg-type]

    async def test_list_conversations(self, store: StepStore) -> None:
        layout: list[tuple[str, str | None, int, str]] = [
            ('a1', 'alpha', 0, 'writer'),
            ('b1', 'beta', 1, 'writer'),
            ('a2', 'alpha', 2, 'reader'),
        ]
        layout += [('loose', None, 3, 'writer'), ('g1', 'gamma', 1, 'reader')]
        for run_id, conversation, minute, agent in layout:
            await self._register(
                store, run_id, conversation_id=conversation, agent_name=agent, started_at=T0 + timedelta(minutes=minute)
            )
        summaries = await store.list_conversations()
        assert [(s.conversation_id, s.run_count, s.head_run_id) for s in summaries] == [
            ('alpha', 2, 'a2'),
            ('gamma', 1, 'g1'),
            ('beta', 1, 'b1'),
        ]
        alpha = summaries[0]
        assert (alpha.first_started_at, alpha.last_started_at) == (T0, T0 + timedelta(minutes=2))
        oldest = await store.list_conversations(newest_first=False, limit=2)
        assert [s.conversation_id for s in oldest] == ['beta', 'gamma']
        writer = await store.list_conversations(agent_name='writer')
        assert [(s.conversation_id, s.run_count, s.head_run_id) for s in writer] == [
            ('beta', 1, 'b1'),
            ('alpha', 1, 'a1'),
        ]
        assert await store.list_conversations(agent_name='nobody') == []

    # --- the conversation helpers ---

    async def test_continue_conversation_returns_the_newest_complete_history(self, store: StepStore) -> None:
        with pytest.raises(LookupError):
            await continue_conversation(store, conversation_id='conv')
        histories = await self._chat(store, 3)
        assert _dump(await continue_conversation(store, conversation_id='conv')) == _dump(histories[-1])
        await self._register(store, 'crashed', conversation_id='conv', origin=_origin('turn-2', 1))
        await store.save_snapshot(_saved('crashed', 1, chat_history(4), state='interrupted'))
        assert _dump(await continue_conversation(store, conversation_id='conv')) == _dump(histories[-1])
        interrupted = await continue_conversation(store, conversation_id='conv', include_interrupted=True)
        assert _dump(interrupted) == _dump(chat_history(4))

    async def test_the_helpers_tag_what_they_return(self, store: StepStore) -> None:
        from step_persistence.origins import tagged_origin

        await self._chat(store, 2)
        assert tagged_origin(await continue_run(store, run_id='turn-0')) == _origin('turn-0', 1)
        assert tagged_origin(await fork_run(store, run_id='turn-0')) == _origin('turn-0', 1, 'forked')
        assert tagged_origin(await continue_conversation(store, conversation_id='conv')) == _origin('turn-1', 1)
        moved = await fork_run(store, run_id='turn-1', conversation_id='elsewhere')
        assert tagged_origin(moved) == _origin('turn-1', 1, 'forked')
        assert [message.conversation_id for message in moved][-1] == 'elsewhere'
        assert tagged_origin(list(moved)[:-1]) is None

    async def test_delete_conversation_keeps_what_another_conversation_shares(self, store: StepStore) -> None:
        histories = await self._chat(store, 3)
        branch = histories[1] + chat_history(1, tag='-branch', start=2)
        await self._turn(store, 'branch', branch, origin=_origin('turn-1', 1, 'forked'), conversation_id='other')
        assert sorted(await delete_conversation(store, conversation_id='conv')) == ['turn-0', 'turn-1', 'turn-2']
        assert await store.list_runs(conversation_id='conv') == []
        await store.collect_media(grace=timedelta(0))
        await self._assert_reads(store, 'branch', branch)
