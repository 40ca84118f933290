"""StepPersistence on real agents: run ids, lineage, events, snapshots and the helpers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, ToolReturnPart

from step_persistence import (
    SnapshotSaved,
    StepPersistence,
    StepStore,
    annotate_tool_effect,
    continue_run,
    fork_run,
    inspect_recovery,
    is_provider_valid,
)
from step_persistence._history import encode_message
from step_persistence.run_ids import validate_path_safe_run_id
from support.backends import StoreMaker
from support.scripted import calls, scripted, text

pytestmark = pytest.mark.anyio


def dump(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode='json')


def lookup_agent(store: StepStore, **options: Any) -> Agent[None, str]:
    """An agent that calls `lookup` twice in sequence, then answers."""
    agent = Agent(
        scripted(
            calls(('lookup', {'key': 'a'}, 'lookup-a')),
            calls(('lookup', {'key': 'b'}, 'lookup-b')),
            text('found a and b'),
        ),
        name='lookup_agent',
        capabilities=[StepPersistence(store=store, **options)],
    )

    @agent.tool_plain
    async def lookup(key: str) -> str:
        return f'value of {key}'

    return agent


async def test_quick_start_records_run_events_snapshots_and_ledger(make_store: StoreMaker) -> None:
    store = await make_store()
    result = await lookup_agent(store, agent_name='librarian').run('find a and b', conversation_id='conv-1')

    [run] = await store.list_runs()
    assert run.agent_name == 'librarian'
    assert run.conversation_id == 'conv-1'
    assert run.parent_run_id is None
    assert run.run_id.startswith('librarian')
    validate_path_safe_run_id(run.run_id)

    events = await store.list_events(run_id=run.run_id)
    assert [event.kind for event in events] == [
        'run_started',
        'model_request_started',
        'model_request_completed',
        'tool_call_started',
        'tool_call_completed',
        'model_request_started',
        'model_request_completed',
        'tool_call_started',
        'tool_call_completed',
        'model_request_started',
        'model_request_completed',
        'run_completed',
    ]
    assert [event.step_index for event in events[1:-1]] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    assert all(event.conversation_id == 'conv-1' and event.agent_name == 'librarian' for event in events)
    assert all(event.idempotency_key for event in events)

    snapshots = await store.list_snapshots(run_id=run.run_id, include_interrupted=True)
    assert [(s.step_index, s.state, len(s.messages)) for s in snapshots] == [
        (1, 'complete', 3),
        (2, 'complete', 5),
        (3, 'complete', 6),
    ]
    assert dump(snapshots[-1].messages) == dump(result.all_messages())
    assert all(is_provider_valid(s.messages) for s in snapshots)

    assert await store.list_unresolved_tool_effects(run_id=run.run_id) == []
    for call_id in ('lookup-a', 'lookup-b'):
        effect = await store.get_tool_effect(run_id=run.run_id, tool_call_id=call_id)
        assert effect is not None and effect.status == 'completed' and effect.ended_at is not None


async def test_every_snapshot_equals_the_history_at_that_point(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = lookup_agent(store, capture_frontier=True)
    result = await agent.run('find a and b')
    final = dump(result.all_messages())
    [run] = await store.list_runs()
    for snapshot in await store.list_snapshots(run_id=run.run_id, include_interrupted=True):
        stored = dump(snapshot.messages)
        # Requests are completed in place (timestamps, ids) after the snapshot that folded them in,
        # so compare the settled prefix exactly and the newest message by kind and parts.
        assert stored[:-1] == final[: len(stored) - 1]
        assert stored[-1]['kind'] == final[len(stored) - 1]['kind']
        assert [p.get('content') for p in stored[-1]['parts']] == [
            p.get('content') for p in final[len(stored) - 1]['parts']
        ]


async def test_capture_frontier_adds_snapshots_around_each_model_request(make_store: StoreMaker) -> None:
    store = await make_store()
    await lookup_agent(store, capture_frontier=True).run('go')
    [run] = await store.list_runs()
    snapshots = await store.list_snapshots(run_id=run.run_id, include_interrupted=True)
    states = [(s.step_index, s.state, len(s.messages)) for s in snapshots]
    assert states == [
        (1, 'complete', 1),  # before request 1
        (1, 'interrupted', 2),  # response 1 with an unanswered call
        (1, 'complete', 3),  # tool cycle 1
        (2, 'complete', 3),
        (2, 'interrupted', 4),
        (2, 'complete', 5),
        (3, 'complete', 5),
        (3, 'complete', 6),  # final answer: no tool call left open
        (3, 'complete', 6),  # end of run: the response has since been stamped with its run id
    ]


@dataclass
class SnapshotListener(AbstractCapability[Any]):
    saved: list[SnapshotSaved] = field(default_factory=list[SnapshotSaved])

    async def on_event(self, ctx: RunContext[Any], *, event: Any) -> None:
        if isinstance(event, SnapshotSaved):
            self.saved.append(event)


async def test_snapshot_saved_events_reach_listeners_and_the_stream(make_store: StoreMaker) -> None:
    store = await make_store()
    listener = SnapshotListener()
    agent = Agent(
        scripted(calls(('lookup', {'key': 'a'}, 'lookup-a')), text('done')),
        capabilities=[StepPersistence(store=store, agent_name='streamer'), listener],
    )

    @agent.tool_plain
    async def lookup(key: str) -> str:
        return key

    streamed: list[SnapshotSaved] = []

    async def handler(ctx: RunContext[None], stream: Any) -> None:
        async for event in stream:
            if isinstance(event, SnapshotSaved):
                streamed.append(event)

    await agent.run('go', event_stream_handler=handler, conversation_id='c')
    [run] = await store.list_runs()
    snapshots = await store.list_snapshots(run_id=run.run_id, include_interrupted=True)
    expected = [(run.run_id, 'c', s.step_index, s.state) for s in snapshots]
    assert len(expected) == 2
    assert [(e.run_id, e.conversation_id, e.step_index, e.state) for e in listener.saved] == expected
    # The final snapshot is written after the stream closed; the tool-cycle one was streamed.
    assert [(e.run_id, e.conversation_id, e.step_index, e.state) for e in streamed] == expected[:1]


async def test_three_runs_in_one_conversation_are_listed_in_order(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = lookup_agent(store, agent_name='orchestrator')
    results = [await agent.run(f'turn {i}', conversation_id='orch-conv') for i in range(3)]
    runs = await store.list_runs(conversation_id='orch-conv')
    assert len(runs) == 3
    assert len({run.run_id for run in runs}) == 3
    assert [run.run_id for run in runs] == [
        StepPersistence(agent_name='orchestrator')._resolve_run_id(_Ctx(result.run_id)) for result in results
    ]


class _Ctx:
    """Just enough of a run context to resolve a derived run id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.agent = None


async def test_delegate_runs_carry_the_orchestrators_run_id(make_store: StoreMaker) -> None:
    store = await make_store()
    librarian = lookup_agent(store, agent_name='librarian')
    orchestrator = Agent(
        scripted(calls(('ask', {'question': 'q1'}), ('ask', {'question': 'q2'})), text('both answered')),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator')],
    )

    @orchestrator.tool_plain
    async def ask(question: str) -> str:
        return (await librarian.run(question)).output

    await orchestrator.run('delegate twice', conversation_id='orch-conv')
    [orchestrator_run] = await store.list_runs(conversation_id='orch-conv')
    delegates = await store.list_runs(parent_run_id=orchestrator_run.run_id)
    assert len(delegates) == 2
    assert {run.agent_name for run in delegates} == {'librarian'}
    for delegate in delegates:
        events = await store.list_events(run_id=delegate.run_id)
        assert {event.parent_run_id for event in events} == {orchestrator_run.run_id}
    # Outside any run, a new librarian run has no parent.
    await librarian.run('standalone', conversation_id='alone')
    [standalone] = await store.list_runs(conversation_id='alone')
    assert standalone.parent_run_id is None


async def test_explicit_parent_run_id_wins(make_store: StoreMaker) -> None:
    store = await make_store()
    await lookup_agent(store, parent_run_id='remote-orchestrator').run('go')
    [run] = await store.list_runs()
    assert run.parent_run_id == 'remote-orchestrator'


async def test_explicit_run_id_names_exactly_one_run(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = lookup_agent(store, run_id='libr-1')
    await agent.run('first')
    assert [run.run_id for run in await store.list_runs()] == ['libr-1']
    events_before = await store.list_events(run_id='libr-1')
    with pytest.raises(ValueError, match='libr-1'):
        await agent.run('second')
    assert await store.list_events(run_id='libr-1') == events_before
    assert len(await store.list_runs()) == 1


async def test_explicit_run_id_already_stored_by_another_instance_is_refused(make_store: StoreMaker) -> None:
    store = await make_store()
    await lookup_agent(store, run_id='shared').run('first')
    snapshots_before = await store.list_snapshots(run_id='shared', include_interrupted=True)
    with pytest.raises(ValueError, match='shared'):
        await lookup_agent(store, run_id='shared').run('second')
    assert await store.list_snapshots(run_id='shared', include_interrupted=True) == snapshots_before


async def test_run_id_falls_back_to_pydantic_ai_run_id(make_store: StoreMaker) -> None:
    store = await make_store()
    result = await lookup_agent(store).run('go')
    [run] = await store.list_runs()
    assert run.run_id == result.run_id
    assert run.agent_name == 'lookup_agent'


async def test_metadata_lands_on_the_run_and_every_event(make_store: StoreMaker) -> None:
    store = await make_store()
    await lookup_agent(store, metadata={'tenant': 'acme'}).run('go')
    [run] = await store.list_runs()
    assert run.metadata == {'tenant': 'acme'}
    assert all(event.metadata == {'tenant': 'acme'} for event in await store.list_events(run_id=run.run_id))


async def test_continue_and_fork_feed_message_history(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = lookup_agent(store, agent_name='librarian')
    first = await agent.run('first question', conversation_id='libr-conv')
    prior = (await store.list_runs(conversation_id='libr-conv'))[-1].run_id
    history = await continue_run(store, run_id=prior)
    assert dump(history) == dump(first.all_messages())
    second = await agent.run('follow-up', message_history=history, conversation_id='libr-conv')
    assert dump(second.all_messages()[: len(history)]) == dump(history)
    runs = await store.list_runs(conversation_id='libr-conv')
    assert len(runs) == 2

    earlier = await fork_run(store, run_id=prior, step_index=1)
    assert len(earlier) == 3
    snapshots = await store.list_snapshots(run_id=prior)
    assert snapshots[0].seq is not None
    by_seq = await fork_run(store, run_id=prior, seq=snapshots[0].seq)
    assert dump(by_seq) == dump(earlier)
    with pytest.raises(LookupError):
        await continue_run(store, run_id='no-such-run')
    with pytest.raises(LookupError):
        await fork_run(store, run_id=prior, step_index=99)
    with pytest.raises(ValueError, match='at most one'):
        await fork_run(store, run_id=prior, seq=1, step_index=1)


async def test_annotations_survive_the_terminal_write(make_store: StoreMaker) -> None:
    store = await make_store()
    agent = Agent(
        scripted(calls(('set_label', {'issue': 7, 'label': 'bug'})), text('labelled')),
        capabilities=[StepPersistence(store=store)],
    )
    seen_in_flight: list[Any] = []

    @agent.tool
    async def set_label(ctx: RunContext[None], issue: int, label: str) -> str:
        await annotate_tool_effect(
            store, ctx, idempotency_key=f'issue-{issue}::label::{label}', effect_summary=f'set label {label!r}'
        )
        [run] = await store.list_runs()
        seen_in_flight.append(await store.get_tool_effect(run_id=run.run_id, tool_call_id=ctx.tool_call_id or ''))
        return 'ok'

    await agent.run('label it')
    [run] = await store.list_runs()
    effect = await store.get_tool_effect(run_id=run.run_id, tool_call_id='set_label-0')
    assert effect is not None
    assert (effect.status, effect.idempotency_key, effect.effect_summary) == (
        'completed',
        'issue-7::label::bug',
        "set label 'bug'",
    )
    assert seen_in_flight[0].status == 'started'
    assert seen_in_flight[0].idempotency_key == 'issue-7::label::bug'


async def test_annotate_outside_a_persisted_tool_call_does_nothing(make_store: StoreMaker) -> None:
    store = await make_store()
    plain = Agent(scripted(calls(('tool', {})), text('done')))

    @plain.tool
    async def tool(ctx: RunContext[None]) -> str:
        await annotate_tool_effect(store, ctx, effect_summary='ignored')
        return 'ok'

    await plain.run('go')
    assert await store.list_runs() == []


async def test_compaction_transcript_handle_is_the_current_run_id(make_store: StoreMaker) -> None:
    store = await make_store()
    capability = StepPersistence(store=store, agent_name='compactor')
    handles: list[str | None] = []
    agent = Agent(scripted(calls(('peek', {})), text('done')), capabilities=[capability])

    @agent.tool_plain
    async def peek() -> str:
        handles.append(capability.compaction_transcript_handle())
        return 'ok'

    assert capability.compaction_transcript_handle() is None
    await agent.run('go')
    [run] = await store.list_runs()
    assert handles == [run.run_id]


async def test_inspect_recovery_of_a_finished_run(make_store: StoreMaker) -> None:
    store = await make_store()
    await lookup_agent(store).run('go')
    [run] = await store.list_runs()
    report = await inspect_recovery(store=store, run_id=run.run_id)
    assert report.unresolved_effects == []
    assert report.completed_tools == ['lookup', 'lookup']
    assert report.failed_tools == []
    assert report.latest_snapshot == report.latest_complete_snapshot
    assert report.latest_snapshot is not None and report.latest_snapshot.step_index == 3


async def test_retention_during_a_long_run(make_store: StoreMaker) -> None:
    store = await make_store(max_snapshots_per_run=3)
    steps = [calls(('lookup', {'key': str(i)}, f'call-{i}')) for i in range(30)]
    agent = Agent(scripted(*steps, text('done')), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    async def lookup(key: str) -> str:
        return key * 3

    result = await agent.run('long run')
    [run] = await store.list_runs()
    retained = await store.list_snapshots(run_id=run.run_id, include_interrupted=True)
    assert len(retained) == 3
    assert [s.step_index for s in retained] == [29, 30, 31]
    latest = await store.latest_snapshot(run_id=run.run_id)
    assert latest is not None and dump(latest.messages) == dump(result.all_messages())


async def test_encoding_work_grows_with_new_messages_not_history(
    make_store: StoreMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from step_persistence import _history

    encoded: list[int] = []

    def counting_encode(message: ModelMessage) -> Any:
        encoded.append(1)
        return encode_message(message)

    monkeypatch.setattr(_history, 'encode_message', counting_encode)

    async def run_with(turns: int) -> int:
        encoded.clear()
        store = await make_store()
        steps = [calls(('lookup', {'key': str(i)}, f'call-{i}')) for i in range(turns)]
        agent = Agent(scripted(*steps, text('done')), capabilities=[StepPersistence(store=store)])

        @agent.tool_plain
        async def lookup(key: str) -> str:
            return key

        await agent.run('go')
        return len(encoded)

    short, long = await run_with(10), await run_with(40)
    # 2 new messages per tool cycle; re-encoding the history each step would be quadratic.
    assert long <= 4 * short + 8, (short, long)
    assert long < 40 * 41 // 2


async def test_durable_replay_of_every_write_stores_nothing_twice(make_store: StoreMaker) -> None:
    from support.recording import RecordingStore, replay, store_contents

    inner = await make_store()
    store = RecordingStore(inner)
    librarian = lookup_agent(store, agent_name='librarian')
    orchestrator = Agent(
        scripted(calls(('ask', {'question': 'q'})), text('answered')),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator')],
    )

    @orchestrator.tool_plain
    async def ask(question: str) -> str:
        return (await librarian.run(question)).output

    await orchestrator.run('go', conversation_id='c')
    before = await store_contents(inner)
    assert store.writes, 'the run should have written through the store'
    await replay(inner, store.writes)
    assert await store_contents(inner) == before


async def test_from_spec_builds_the_capability_store() -> None:
    capability = StepPersistence.from_spec(store='memory', agent_name='spec-agent')
    assert capability.agent_name == 'spec-agent'
    agent = Agent(scripted(text('hi')), capabilities=[capability])
    await agent.run('go')
    assert len(await capability.store.list_runs()) == 1


def test_derived_run_ids_are_injective_and_path_safe() -> None:
    from step_persistence.run_ids import derive_run_id

    pairs = [
        ('a', 'b-c'),
        ('a-b', 'c'),
        ('a.-b', 'c'),
        ('a', '.-b.-c'),
        ('code librarian', 'x'),
        ('code_librarian', 'x'),
        ('名前', 'x'),
        ('', 'x'),
        ('..', '..'),
        ('a/b', '../etc'),
    ]
    derived = [derive_run_id(agent, run) for agent, run in pairs]
    assert len(set(derived)) == len(pairs)
    for run_id in derived:
        validate_path_safe_run_id(run_id)
    assert re.fullmatch(r'code_librarian-[0-9a-f]{16}', derive_run_id('code_librarian', '0198-ab'))
    assert derive_run_id('code_librarian', '0198-ab') == derive_run_id('code_librarian', '0198-ab')
    assert derive_run_id('code_librarian', '0198-ab') != derive_run_id('code_librarian', '0198-ac')
    with pytest.raises(ValueError, match='200'):
        derive_run_id('x' * 190, 'y')


def test_is_provider_valid() -> None:
    call = calls(('t', {}, 'id-1'))
    answered = ModelResponse(parts=[])
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    prompt = ModelRequest(parts=[UserPromptPart('q')])
    answer = ModelRequest(parts=[ToolReturnPart('t', 'ok', 'id-1')])
    orphan = ModelRequest(parts=[ToolReturnPart('t', 'ok', 'id-2')])
    assert is_provider_valid([prompt, call, answer, answered])
    assert not is_provider_valid([prompt, call])
    assert not is_provider_valid([prompt, orphan])
    assert not is_provider_valid([prompt, call, answer, answer])
