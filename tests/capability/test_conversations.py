"""Chats through the capability: each turn a new run, its origin found, its history shared, on every backend.

A turn is one `Agent.run` given the previous history, kept by the application
(`result.all_messages()`) or read back with the helpers; each run is recorded with the snapshot
it continued or forked (`RunRecord.origin`), and every snapshot reads back as the run's history.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
)

from step_persistence import RunRecord, StepStore, continue_run, fork_run
from step_persistence.conversations import continue_conversation
from step_persistence.records import RunOrigin
from support.backends import StoreMaker
from support.chat import chat_agent

pytestmark = pytest.mark.anyio


def dumped(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode='json')


async def newest_run(store: StepStore, conversation_id: str) -> RunRecord:
    runs = await store.list_runs(conversation_id=conversation_id, newest_first=True, limit=1)
    assert len(runs) == 1
    return runs[0]


async def final_seq(store: StepStore, run_id: str) -> int:
    latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    assert latest is not None and latest.seq is not None
    return latest.seq


async def assert_final_history(store: StepStore, run_id: str, history: list[ModelMessage]) -> None:
    latest = await store.latest_snapshot(run_id=run_id)
    assert latest is not None and dumped(latest.messages) == dumped(history)


async def test_a_chat_the_application_keeps_continues_run_after_run(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = chat_agent(store)
    history: list[ModelMessage] = []
    runs: list[RunRecord] = []
    for turn in range(6):
        result = await agent.run(f'question {turn}', message_history=history)
        history = result.all_messages()
        conversation_id = history[0].conversation_id
        assert conversation_id is not None
        runs.append(await newest_run(store, conversation_id))
        await assert_final_history(store, runs[-1].run_id, history)
    assert runs[0].origin is None
    for previous, run in itertools.pairwise(runs):
        assert run.origin == RunOrigin(
            kind='continued', run_id=previous.run_id, seq=await final_seq(store, previous.run_id)
        )
        assert run.conversation_id == runs[0].conversation_id
    assert dumped(await continue_conversation(store, conversation_id=conversation_id)) == dumped(history)
    [summary] = await store.list_conversations()
    assert (summary.conversation_id, summary.run_count, summary.head_run_id) == (conversation_id, 6, runs[-1].run_id)


async def test_streamed_turns_continue_like_awaited_ones(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = chat_agent(store)
    first = await agent.run('question 0')
    async with agent.run_stream('question 1', message_history=first.all_messages()) as streamed:
        await streamed.get_output()
    history = streamed.all_messages()
    first_run, second_run = await store.list_runs(conversation_id=history[0].conversation_id)
    assert second_run.origin == RunOrigin(
        kind='continued', run_id=first_run.run_id, seq=await final_seq(store, first_run.run_id)
    )
    third = await agent.run('question 2', message_history=history)
    third_run = await newest_run(store, second_run.conversation_id or '')
    assert third_run.origin == RunOrigin(
        kind='continued', run_id=second_run.run_id, seq=await final_seq(store, second_run.run_id)
    )
    await assert_final_history(store, third_run.run_id, third.all_messages())


async def test_the_helpers_continue_and_fork_with_lineage(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = chat_agent(store)
    turns = [await agent.run('question 0')]
    for turn in (1, 2, 3):
        turns.append(await agent.run(f'question {turn}', message_history=turns[-1].all_messages()))
    conversation_id = turns[0].all_messages()[0].conversation_id or ''
    runs = await store.list_runs(conversation_id=conversation_id)
    third = runs[2]

    branch = await agent.run(
        'another question 3', message_history=await fork_run(store, run_id=third.run_id, conversation_id='branch')
    )
    [forked] = await store.list_runs(conversation_id='branch')
    assert forked.origin == RunOrigin(kind='forked', run_id=third.run_id, seq=await final_seq(store, third.run_id))
    await assert_final_history(store, forked.run_id, branch.all_messages())
    assert [message.conversation_id for message in branch.all_messages()][-1] == 'branch'

    again = await agent.run('question 4', message_history=await continue_run(store, run_id=runs[-1].run_id))
    continued = await newest_run(store, conversation_id)
    assert continued.origin == RunOrigin(
        kind='continued', run_id=runs[-1].run_id, seq=await final_seq(store, runs[-1].run_id)
    )
    await assert_final_history(store, continued.run_id, again.all_messages())
    assert [run.run_id for run in await store.list_runs(origin_run_id=third.run_id)] == [runs[3].run_id, forked.run_id]
    await assert_final_history(store, runs[3].run_id, turns[3].all_messages())
    summaries = await store.list_conversations()
    assert [(s.conversation_id, s.run_count) for s in summaries] == [(conversation_id, 5), ('branch', 1)]


async def test_two_tabs_continuing_one_head_keep_both_turns(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = chat_agent(store)
    first = await agent.run('question 0')
    conversation_id = first.all_messages()[0].conversation_id or ''
    head = await newest_run(store, conversation_id)
    tab_a = await agent.run(
        'from tab a', message_history=await continue_conversation(store, conversation_id=conversation_id)
    )
    tab_b_history = await continue_conversation(store, conversation_id=conversation_id)
    assert dumped(tab_b_history) == dumped(tab_a.all_messages()), 'the newest turn is where a new tab starts'
    stale = first.all_messages()  # a tab that was open before tab a's turn
    tab_b = await agent.run('from tab b', message_history=stale)
    run_a, run_b = (await store.list_runs(conversation_id=conversation_id))[1:]
    seq = await final_seq(store, head.run_id)
    assert run_a.origin == RunOrigin(kind='continued', run_id=head.run_id, seq=seq)
    assert run_b.origin == RunOrigin(kind='forked', run_id=head.run_id, seq=seq)
    await assert_final_history(store, run_a.run_id, tab_a.all_messages())
    await assert_final_history(store, run_b.run_id, tab_b.all_messages())
    assert dumped(await continue_conversation(store, conversation_id=conversation_id)) == dumped(tab_b.all_messages())


async def test_a_history_the_application_changed_has_no_origin_and_reads_back(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = chat_agent(store)
    first = await agent.run('question 0')
    edited = [*first.all_messages()[:-1], ModelResponse(parts=[TextPart('an answer the user rewrote')])]
    second = await agent.run('question 1', message_history=edited)
    runs = await store.list_runs(conversation_id=first.all_messages()[0].conversation_id)
    assert runs[1].origin is None
    await assert_final_history(store, runs[1].run_id, second.all_messages())
    await assert_final_history(store, runs[0].run_id, first.all_messages())
