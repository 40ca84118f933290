"""The event ending each model request carries the model that answered and the tokens it reported.

On every entry point the completed events add up to what the run's own `usage` says, and the run's
summary gives the same totals. The pydantic-ai behaviour the streamed case relies on (the calls of
`run_stream`'s final response run before its response is handed back) is pinned by a test of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.run import AgentRunResultEvent
from pydantic_ai.usage import RequestUsage, RunUsage, UsageLimits

from step_persistence import InMemoryStepStore, StepEvent, StepPersistence, TokenUsage
from step_persistence.reporting import summarize_runs
from support.scripted import calls, scripted, text

pytestmark = pytest.mark.anyio

LOOKUP = calls(('lookup', {'key': 'a'}, 'lookup-1'))
FINAL_BESIDE_A_CALL = calls(('lookup', {'key': 'z'}, 'lookup-2'), ('final_result', {'value': 'z'}, 'out-1'))
ENDINGS = ('model_request_completed', 'model_request_failed')


class Answer(BaseModel):
    value: str


def persisted(store: InMemoryStepStore, model: FunctionModel, **options: Any) -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(model, capabilities=[StepPersistence(store=store)], **options)

    @agent.tool_plain
    async def lookup(key: str) -> str:
        return f'value of {key}'

    return agent


async def via_run(store: InMemoryStepStore, model: FunctionModel) -> RunUsage:
    return (await persisted(store, model).run('go')).usage


async def via_run_stream(store: InMemoryStepStore, model: FunctionModel) -> RunUsage:
    async with persisted(store, model).run_stream('go') as stream:
        await stream.get_output()
    return stream.usage


async def via_run_stream_with_calls_in_the_final_response(store: InMemoryStepStore, model: FunctionModel) -> RunUsage:
    async with persisted(store, model, output_type=Answer).run_stream('go') as stream:
        assert await stream.get_output() == Answer(value='z')
    return stream.usage


async def via_iter(store: InMemoryStepStore, model: FunctionModel) -> RunUsage:
    async with persisted(store, model).iter('go') as run:
        async for _ in run:
            pass
    return run.usage


async def via_run_stream_events(store: InMemoryStepStore, model: FunctionModel) -> RunUsage:
    usage: RunUsage | None = None
    async with persisted(store, model).run_stream_events('go') as events:
        async for event in events:
            if isinstance(event, AgentRunResultEvent):
                usage = event.result.usage
    assert usage is not None
    return usage


EntryPoint = Callable[[InMemoryStepStore, FunctionModel], Awaitable[RunUsage]]
ENTRY_POINTS: dict[str, tuple[EntryPoint, tuple[ModelResponse, ...]]] = {
    'run': (via_run, (LOOKUP, text('done'))),
    'run_stream': (via_run_stream, (LOOKUP, text('one two three'))),
    'run_stream, final calls': (via_run_stream_with_calls_in_the_final_response, (FINAL_BESIDE_A_CALL,)),
    'iter': (via_iter, (LOOKUP, text('done'))),
    'run_stream_events': (via_run_stream_events, (LOOKUP, LOOKUP, text('done'))),
}


async def events_of_the_run(store: InMemoryStepStore) -> list[StepEvent]:
    [run] = await store.list_runs()
    return await store.list_events(run_id=run.run_id)


@pytest.mark.parametrize('entry_point', list(ENTRY_POINTS))
async def test_completed_model_requests_add_up_to_the_runs_usage(entry_point: str) -> None:
    drive, steps = ENTRY_POINTS[entry_point]
    store, model = InMemoryStepStore(), scripted(*steps)
    usage = await drive(store, model)
    events = await events_of_the_run(store)
    completed = [event for event in events if event.kind == 'model_request_completed']
    assert len(completed) == usage.requests == sum(event.kind == 'model_request_started' for event in events)
    assert {event.model_name for event in completed} == {model.model_name}
    reported = [event.usage for event in completed]
    assert all(each is not None and each.input_tokens > 0 and each.output_tokens > 0 for each in reported)
    assert sum(each.input_tokens for each in reported if each) == usage.input_tokens
    assert sum(each.output_tokens for each in reported if each) == usage.output_tokens
    assert all(event.usage is None and event.model_name is None for event in events if event.kind not in ENDINGS)
    [summary] = await summarize_runs(store)
    assert (summary.model_requests, summary.input_tokens, summary.output_tokens) == (
        usage.requests,
        usage.input_tokens,
        usage.output_tokens,
    )


def answering(usage: RequestUsage) -> FunctionModel:
    """A model that answers once with `usage` reported as it is, under the name `provider:model-1`."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart('done')], usage=usage)

    return FunctionModel(respond, model_name='provider:model-1')


async def test_the_cache_tokens_are_kept_as_the_model_reported_them() -> None:
    store = InMemoryStepStore()
    reported = RequestUsage(input_tokens=1000, output_tokens=50, cache_read_tokens=800, cache_write_tokens=150)
    result = await persisted(store, answering(reported)).run('go')
    [event] = [event for event in await events_of_the_run(store) if event.kind == 'model_request_completed']
    assert event.model_name == 'provider:model-1'
    assert event.usage == TokenUsage(input_tokens=1000, output_tokens=50, cache_read_tokens=800, cache_write_tokens=150)
    [summary] = await summarize_runs(store)
    assert (summary.cache_read_tokens, summary.cache_write_tokens) == (800, 150)
    assert (result.usage.cache_read_tokens, result.usage.cache_write_tokens) == (800, 150)


async def test_a_response_without_usage_or_with_counts_no_record_holds_is_kept_without_usage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryStepStore()
    await persisted(store, answering(RequestUsage(unmeasured_requests=1))).run('go')
    caplog.set_level(logging.WARNING, logger='step_persistence')
    result = await persisted(store, answering(RequestUsage(input_tokens=-5, output_tokens=3))).run('go')
    assert result.output == 'done'
    assert 'without its usage' in caplog.text
    for run in await store.list_runs():
        [event] = [e for e in await store.list_events(run_id=run.run_id) if e.kind == 'model_request_completed']
        assert (event.model_name, event.usage) == ('provider:model-1', None)
    assert [(summary.input_tokens, summary.output_tokens) for summary in await summarize_runs(store)] == [(0, 0)] * 2


async def test_a_stream_cut_short_and_a_response_over_a_token_limit_keep_their_usage() -> None:
    store = InMemoryStepStore()
    async with persisted(store, scripted(text('the answer is forty two and more'))).run_stream('go') as stream:
        async for _ in stream.stream_text(debounce_by=None):
            break
    [failed] = [event for event in await events_of_the_run(store) if event.kind == 'model_request_failed']
    assert 'stopped before the response was complete' in (failed.error or '')
    assert failed.model_name is not None and failed.usage is not None and failed.usage.output_tokens > 0

    store = InMemoryStepStore()
    with pytest.raises(UsageLimitExceeded):
        await persisted(store, scripted(text('done'))).run('go', usage_limits=UsageLimits(output_tokens_limit=0))
    events = await events_of_the_run(store)
    [completed] = [event for event in events if event.kind == 'model_request_completed']
    assert completed.usage is not None and completed.usage.output_tokens > 0, 'billed, though the run failed'
    assert events[-1].kind == 'run_failed'


async def test_pydantic_ai_runs_the_calls_of_a_streamed_final_response_before_handing_it_back() -> None:
    """What `StreamWatch` is for: a `run_stream` whose final response also calls a function tool runs that
    call before the response is in the history or back from the model request, so the event ending the
    request (queued before the call starts) reads the response from its stream."""
    seen: list[ModelMessage] = []
    agent: Agent[None, Answer] = Agent(scripted(FINAL_BESIDE_A_CALL), output_type=Answer)

    @agent.tool
    async def lookup(ctx: RunContext[None], key: str) -> str:
        seen.extend(ctx.messages)
        return key

    async with agent.run_stream('go') as stream:
        assert await stream.get_output() == Answer(value='z')
    assert seen and not any(isinstance(message, ModelResponse) for message in seen)
    assert any(isinstance(message, ModelResponse) for message in stream.all_messages())
