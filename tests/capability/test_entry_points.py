"""Every way pydantic-ai runs an agent, and every way a run ends, leaves a record that passes the audit.

The scenario matrix: each scenario drives one entry point (`run`, `run_stream`, `run_stream_events`,
`iter`, deferred tools, ...) to one outcome, checks what is particular to it, and ends with
`audit_run` (tests/support/audit.py) on every run it made. Each runs on every backend of the
registry. `run_sync` and `run_stream_sync` are in sync tests of their own; the scenarios whose record depends on timing
(abandoned streams, cancellation, timeouts) also run 20 times in one test each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from pydantic import BaseModel
from pydantic_ai import Agent, CancellationToken, ModelRetry, RunContext
from pydantic_ai.exceptions import (
    ApprovalRequired,
    CallDeferred,
    RunCancelled,
    RunTimedOut,
    UnexpectedModelBehavior,
    UsageLimitExceeded,
    UserError,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.result import StreamedRunResult
from pydantic_ai.run import AgentRun
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import RunUsage, UsageLimits

from step_persistence import (
    InMemoryStepStore,
    SnapshotSaved,
    SqlStepStore,
    StepEvent,
    StepPersistence,
    StepStore,
    continue_run,
)
from step_persistence.helpers import unanswered_tool_call_ids
from step_persistence.reporting import summarize_runs
from step_persistence.stores.sql.reporting import read_report
from support.audit import Audit, audit_run, audit_store, returns_in, successful_returns
from support.backends import Backend, StoreMaker
from support.recording import RecordingStore

pytestmark = pytest.mark.anyio

# --- a scripted model that streams word by word ---


def calls(*tool_calls: tuple[str, dict[str, Any], str]) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(name, args, call_id) for name, args, call_id in tool_calls])


def text(content: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


@dataclass
class Script:
    """A model answering the n-th request it gets with `steps[n]` (the last one repeats).

    Streamed, a text part arrives one word per chunk and a tool call's arguments in two chunks, so a
    consumer can stop a stream midway. `block_at=n` makes the n-th request wait forever, after setting
    `entered`, for cancellation and timeout scenarios.
    """

    steps: Sequence[ModelResponse]
    block_at: int | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    requests: int = 0

    async def _next(self) -> ModelResponse:
        index = self.requests
        self.requests += 1
        if index == self.block_at:
            self.entered.set()
            await asyncio.Event().wait()
        return self.steps[min(index, len(self.steps) - 1)]

    async def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return await self._next()

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        response = await self._next()
        for index, part in enumerate(response.parts):
            if isinstance(part, TextPart):
                for position, word in enumerate(part.content.split(' ')):
                    yield f' {word}' if position else word
            elif isinstance(part, ToolCallPart):
                arguments = part.args_as_json_str()
                middle = len(arguments) // 2
                yield {
                    index: DeltaToolCall(
                        name=part.tool_name, json_args=arguments[:middle], tool_call_id=part.tool_call_id
                    )
                }
                yield {index: DeltaToolCall(json_args=arguments[middle:])}

    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, stream_function=self.stream)


def model(*steps: ModelResponse, **options: Any) -> FunctionModel:
    return Script(list(steps), **options).model()


@dataclass
class ProviderScript(Script):
    """A `Script` whose streams end where `cancel()` stops them, as a provider's do.

    A provider's stream closes its connection on `cancel()` (`StreamedResponse.close_stream`), so
    nothing more arrives; `FunctionModel` has no connection to close, and its stream goes on to
    its end if read after `cancel()`.
    """

    closed: bool = False

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        async for chunk in super().stream(messages, info):
            if self.closed:
                return
            yield chunk

    def provider(self) -> Model:
        return ClosesOnCancel(self.model(), self)


class ClosesOnCancel(WrapperModel):
    """`wrapped`, its streams' `close_stream` closing the `ProviderScript` they read from."""

    def __init__(self, wrapped: Model, script: ProviderScript) -> None:
        super().__init__(wrapped)
        self.script = script

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as stream:

            async def close_stream() -> None:
                self.script.closed = True

            stream.close_stream = close_stream  # type: ignore[method-assign]
            yield stream


LOOKUP = calls(('lookup', {'key': 'a'}, 'lookup-1'))


class Answer(BaseModel):
    value: str


def persisted(store: StepStore, scripted: Model | Script, **options: Any) -> Agent[None, Any]:
    """An agent on `scripted` with a `lookup` tool, persisted into `store` with lineage and metadata."""
    agent_model = scripted.model() if isinstance(scripted, Script) else scripted
    capability = StepPersistence(store=store, agent_name='chat', metadata={'tenant': 'acme'})
    agent: Agent[None, Any] = Agent(agent_model, capabilities=[capability], **options)

    @agent.tool_plain
    async def lookup(key: str) -> str:
        return f'value of {key}'

    return agent


def dump(messages: Sequence[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(list(messages), mode='json')


def shape(messages: Sequence[ModelMessage]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """Messages without their timestamps: kind, and each part's kind with its call id and content."""
    shaped = []
    for message in messages:
        parts = []
        for part in message.parts:
            identity = getattr(part, 'tool_call_id', None)
            content = part.args_as_dict() if isinstance(part, ToolCallPart) else getattr(part, 'content', None)
            parts.append((part.part_kind, (identity, content)))
        shaped.append((message.kind, parts))
    return shaped


async def only_run(store: StepStore) -> str:
    [run] = await store.list_runs()
    return run.run_id


async def audit_only_run(store: StepStore, **options: Any) -> Audit:
    audit = await audit_run(store, await only_run(store), **options)
    assert audit.run.agent_name == 'chat' and audit.run.metadata == {'tenant': 'acme'}
    return audit


async def assert_totals(store: StepStore, usage: RunUsage) -> None:
    """The run's totals are pydantic-ai's `usage`: through the protocol, and on SQL from the `run_summary` view."""
    reports = [await summarize_runs(store)]
    if isinstance(store, SqlStepStore):
        reports.append((await read_report(store))[0])
    for [summary] in reports:
        totals = (summary.model_requests, summary.input_tokens, summary.output_tokens)
        assert totals == (usage.requests, usage.input_tokens, usage.output_tokens)
        assert summary.input_tokens > 0 and summary.output_tokens > 0


INTERRUPTED_RETURN = 'The tool call was interrupted before a result was produced.'
"""pydantic-ai's return for a call it closes without running it."""

TOOL_CYCLE_EVENTS = [
    'run_started',
    'model_request_started',
    'model_request_completed',
    'tool_call_started',
    'tool_call_completed',
    'model_request_started',
]

# --- the scenarios ---

Scenario = Callable[[StepStore], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(function: Scenario) -> Scenario:
    SCENARIOS[function.__name__] = function
    return function


@scenario
async def run_completes(store: StepStore) -> None:
    result = await persisted(store, model(LOOKUP, text('done'))).run('go', conversation_id='conv')
    audit = await audit_only_run(store)
    assert audit.run.conversation_id == 'conv'
    assert audit.kinds == [*TOOL_CYCLE_EVENTS, 'model_request_completed', 'run_completed']
    assert [(s.step_index, s.state) for s in audit.snapshots] == [(1, 'complete'), (2, 'complete')]
    assert audit.latest is not None and dump(audit.latest.messages) == dump(result.all_messages())
    await assert_totals(store, result.usage)


@scenario
async def run_continued_with_the_conversation_object(store: StepStore) -> None:
    agent = persisted(store, model(LOOKUP, text('done')))
    first = await agent.run('go', conversation_id='conv')
    second = await agent.run('more', conversation=first.conversation)
    audits = await audit_store(store)
    assert [audit.run.conversation_id for audit in audits] == ['conv', 'conv']
    assert [audit.terminal.kind for audit in audits] == ['run_completed', 'run_completed']
    # What the store continues from is what the conversation object carried, and each run's final snapshot is its
    # result's history.
    assert dump(await continue_run(store, run_id=audits[0].run.run_id)) == dump(first.conversation.messages)
    assert audits[1].latest is not None and dump(audits[1].latest.messages) == dump(second.all_messages())


@scenario
async def run_stream_text_consumed(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text('one two three'))).run_stream('go') as stream:
        assert await stream.get_output() == 'one two three'
    audit = await audit_only_run(store)
    assert audit.kinds == [*TOOL_CYCLE_EVENTS, 'model_request_completed', 'run_completed']
    assert audit.latest is not None and dump(audit.latest.messages) == dump(stream.all_messages())


@scenario
async def run_stream_output_tool_consumed(store: StepStore) -> None:
    final = calls(('final_result', {'value': 'a and b'}, 'out-1'))
    agent = persisted(store, model(LOOKUP, final), output_type=Answer)
    async with agent.run_stream('go') as stream:
        assert await stream.get_output() == Answer(value='a and b')
    audit = await audit_only_run(store)
    assert audit.kinds == [*TOOL_CYCLE_EVENTS, 'model_request_completed', 'run_completed']
    latest = audit.latest
    assert latest is not None and latest.state == 'complete' and len(latest.messages) == 5
    # The stream's result holds the output call's return; the run's own history does not (see
    # test_pydantic_ai_behaviour.py): the final snapshot is the stream result's history.
    assert shape(latest.messages) == shape(stream.all_messages())
    assert successful_returns(latest.messages)['out-1'] == 'Final result processed.'
    # `run` stores the same history.
    result = await persisted(InMemoryStepStore(), model(LOOKUP, final), output_type=Answer).run('go')
    assert shape(latest.messages) == shape(result.all_messages())
    # Continuing the streamed chat starts after the answer, so the model does not answer again.
    assert shape(await continue_run(store, run_id=audit.run.run_id)) == shape(stream.all_messages())
    await assert_totals(store, stream.usage)


@scenario
async def run_stream_output_tool_beside_a_function_call(store: StepStore) -> None:
    final = calls(('lookup', {'key': 'z'}, 'lookup-2'), ('final_result', {'value': 'z'}, 'out-1'))
    agent = persisted(store, model(final), output_type=Answer)
    async with agent.run_stream('go') as stream:
        assert await stream.get_output() == Answer(value='z')
    audit = await audit_only_run(store)
    assert audit.statuses() == {'lookup-2': 'completed'}
    assert audit.kinds == [
        'run_started',
        'model_request_started',
        'model_request_completed',  # the call ran on the whole response, after the request ended
        'tool_call_started',
        'tool_call_completed',
        'run_completed',
    ]
    assert audit.latest is not None and audit.latest.state == 'complete'
    assert shape(audit.latest.messages) == shape(stream.all_messages())


@scenario
async def run_stream_text_abandoned(store: StepStore) -> None:
    full = 'the answer is forty two and then some more words'
    async with persisted(store, model(LOOKUP, text(full))).run_stream('go') as stream:
        seen = await anext(aiter(stream.stream_text(debounce_by=None)))
    audit = await audit_only_run(store)
    assert audit.kinds[-3:] == ['model_request_started', 'model_request_failed', 'run_failed']
    assert 'stopped before the response was complete' in (audit.events[-2].error or '')
    latest = audit.latest
    assert latest is not None and latest.state == 'complete'
    [*_, response] = latest.messages
    assert isinstance(response, ModelResponse) and response.state == 'interrupted'
    kept = response.text or ''
    assert kept.startswith(seen) and full.startswith(kept)


STREAM_CANCELLED = repr(
    asyncio.CancelledError(
        'the response stream was cancelled (StreamedRunResult.cancel()) before an output was read from it, '
        'so the run has no result'
    )
)
CUT_SHORT = "the response stream stopped before the response was complete (state 'interrupted')"
FULL = 'the answer is forty two and then some more words'


def last_text(messages: Sequence[ModelMessage]) -> str | None:
    """The text of the response that ends `messages`."""
    response = messages[-1]
    assert isinstance(response, ModelResponse)
    return response.text


def assert_no_result(stream: StreamedRunResult[None, Any]) -> None:
    """pydantic-ai's word on a stream cancelled before an output was read from it: the run has no result."""
    with pytest.raises(UserError, match='cancelled before it produced an output'):
        stream.result  # noqa: B018


async def assert_cancelled_without_output(store: StepStore, history: Sequence[ModelMessage], seen: str) -> Audit:
    """The record of a text stream cancelled with no output read: `run_failed`, the caller's history up to the
    response, and the response as far as it streamed (`seen` at least), `interrupted`."""
    audit = await audit_only_run(store)
    assert audit.kinds[-3:] == ['model_request_started', 'model_request_failed', 'run_failed']
    assert audit.events[-2].error == CUT_SHORT and audit.terminal.error == STREAM_CANCELLED
    latest = audit.latest
    assert latest is not None and latest.state == 'complete' and shape(latest.messages[:-1]) == shape(history[:-1])
    [*_, response] = latest.messages
    assert isinstance(response, ModelResponse) and response.state == 'interrupted'
    assert (response.text or '').startswith(seen) and FULL.startswith(response.text or '')
    return audit


async def assert_cancelled_with_output(
    store: StepStore, stream: StreamedRunResult[None, Any], output: Any, *, history: Sequence[ModelMessage]
) -> Audit:
    """The record of a stream cancelled, then read to an output: `run_completed`, its final snapshot `complete`,
    ending with the response the output came from (`interrupted`: the stream was cut) after the caller's `history`."""
    assert stream.result.output == output  # pydantic-ai settles the run on it
    audit = await audit_only_run(store)
    assert audit.kinds[-3:] == ['model_request_started', 'model_request_failed', 'run_completed']
    assert audit.events[-2].error == CUT_SHORT and audit.terminal.error is None
    latest = audit.latest
    assert latest is not None and latest.state == 'complete'
    response = next(m for m in reversed(latest.messages) if isinstance(m, ModelResponse))
    assert response.state == 'interrupted' and shape(latest.messages[: len(history) - 1]) == shape(history[:-1])
    # Continuing from the store starts after the answer the caller got.
    assert dump(await continue_run(store, run_id=audit.run.run_id)) == dump(latest.messages)
    return audit


@scenario
async def run_stream_cancelled(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text(FULL))).run_stream('go') as stream:
        seen = await anext(aiter(stream.stream_text(debounce_by=None)))
        await stream.cancel()
        history = stream.all_messages()
    assert_no_result(stream)
    audit = await assert_cancelled_without_output(store, history, seen)
    assert audit.latest is not None and dump(audit.latest.messages) == dump(history)  # nothing was read after it


@scenario
async def run_stream_cancelled_before_reading(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text(FULL))).run_stream('go') as stream:
        await stream.cancel()
        history = stream.all_messages()
    assert_no_result(stream)
    # `run_stream` hands the stream over at its first text: that much is in the response.
    audit = await assert_cancelled_without_output(store, history, '')
    assert audit.latest is not None and dump(audit.latest.messages) == dump(history) and history[-1].parts


@scenario
async def run_stream_cancelled_then_text_read_to_the_end(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text(FULL))).run_stream('go') as stream:
        await stream.cancel()
        history = stream.all_messages()
        texts = [chunk async for chunk in stream.stream_text(debounce_by=None)]
    # `stream_text` validates no output: pydantic-ai settles no result on it. (`FunctionModel` streams on after
    # `cancel()`, to the end; `all_messages()` keeps the response as it was at `cancel()`.)
    assert_no_result(stream)
    audit = await assert_cancelled_without_output(store, history, texts[-1])
    assert audit.latest is not None and last_text(audit.latest.messages) == texts[-1] == FULL


@scenario
async def run_stream_cancelled_then_output_read(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text(FULL))).run_stream('go') as stream:
        seen = await anext(aiter(stream.stream_text(debounce_by=None)))
        await stream.cancel()
        output = await stream.get_output()
        history = stream.all_messages()
    # `FunctionModel` streams on after `cancel()`: the output is the whole text, though `all_messages()` keeps
    # the response as it was at `cancel()`. The record keeps the response the output came from.
    assert output == FULL and last_text(history) == seen
    audit = await assert_cancelled_with_output(store, stream, output, history=history)
    assert audit.latest is not None and last_text(audit.latest.messages) == output


@scenario
async def run_stream_cancelled_before_reading_then_output_streamed(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text(FULL))).run_stream('go') as stream:
        await stream.cancel()
        outputs = [output async for output in stream.stream_output(debounce_by=None)]
        history = stream.all_messages()
    audit = await assert_cancelled_with_output(store, stream, outputs[-1], history=history)
    assert audit.latest is not None and last_text(audit.latest.messages) == outputs[-1] == FULL


@scenario
async def run_stream_cancelled_on_a_provider_then_output_read(store: StepStore) -> None:
    script = ProviderScript([LOOKUP, text(FULL)])
    async with persisted(store, script.provider()).run_stream('go') as stream:
        seen = await anext(aiter(stream.stream_text(debounce_by=None)))
        await stream.cancel()
        output = await stream.get_output()
        history = stream.all_messages()
    # The stream ended at `cancel()`: the output is the text that had arrived, the response the history holds.
    assert output == seen and FULL.startswith(output) and output != FULL
    audit = await assert_cancelled_with_output(store, stream, output, history=history)
    assert audit.latest is not None and dump(audit.latest.messages) == dump(history)


@scenario
async def run_stream_cancelled_after_the_output_was_read(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text(FULL))).run_stream('go') as stream:
        assert await stream.get_output() == FULL
        await stream.cancel()  # the stream had ended: the response stays complete, the run completes
    assert stream.response.state == 'complete' and stream.result.output == FULL
    audit = await audit_only_run(store)
    assert audit.kinds == [*TOOL_CYCLE_EVENTS, 'model_request_completed', 'run_completed']
    assert audit.latest is not None and dump(audit.latest.messages) == dump(stream.all_messages())


@scenario
async def run_stream_output_tool_cancelled(store: StepStore) -> None:
    final = calls(('final_result', {'value': 'a long answer'}, 'out-1'))
    async with persisted(store, model(LOOKUP, final), output_type=Answer).run_stream('go') as stream:
        await anext(aiter(stream.stream_output(debounce_by=None)))
        await stream.cancel()
        history = stream.all_messages()
    assert_no_result(stream)
    audit = await audit_only_run(store)
    assert audit.kinds[-2:] == ['model_request_failed', 'run_failed'] and audit.terminal.error == STREAM_CANCELLED
    latest, complete = audit.latest, audit.latest_complete
    assert latest is not None and latest.state == 'interrupted' and shape(latest.messages) == shape(history)
    assert complete is not None and complete.step_index == 1 and len(complete.messages) == 3


@scenario
async def run_stream_output_tool_cancelled_then_output_read(store: StepStore) -> None:
    final = calls(('lookup', {'key': 'z'}, 'lookup-2'), ('final_result', {'value': 'a long answer'}, 'out-1'))
    async with persisted(store, model(LOOKUP, final), output_type=Answer).run_stream('go') as stream:
        await anext(aiter(stream.stream_output(debounce_by=None)))
        await stream.cancel()
        output = await stream.get_output()
        history = stream.all_messages()
    assert output == Answer(value='a long answer')
    audit = await assert_cancelled_with_output(store, stream, output, history=history)
    # The output call is answered, as `run` answers it; the function call beside it never ran (on_complete, which
    # runs it, does not run on a cancelled stream), and is answered as a call a final result skipped.
    assert audit.effects.keys() == {'lookup-1'}
    latest = audit.latest
    assert latest is not None
    answer = latest.messages[-1]
    assert isinstance(answer, ModelRequest) and returns_in([answer]) == {
        'lookup-2': 'Tool not executed - a final result was already processed.',
        'out-1': 'Final result processed.',
    }


@scenario
async def run_stream_output_tool_cancelled_on_a_provider_then_output_read(store: StepStore) -> None:
    script = ProviderScript([LOOKUP, calls(('final_result', {'value': 'a long answer'}, 'out-1'))])
    agent = persisted(store, script.provider(), output_type=Answer)
    history: list[ModelMessage] = []

    async def cancel_then_read() -> None:
        async with agent.run_stream('go') as stream:
            await anext(aiter(stream.stream_output(debounce_by=None)))
            await stream.cancel()
            history.extend(stream.all_messages())
            await stream.get_output()  # the arguments were cut off: they do not validate

    with pytest.raises(UnexpectedModelBehavior, match='Output validation failed') as raised:
        await cancel_then_read()
    audit = await audit_only_run(store)
    assert audit.kinds[-2:] == ['model_request_failed', 'run_failed'] and audit.terminal.error == repr(raised.value)
    latest = audit.latest
    assert latest is not None and latest.state == 'interrupted' and shape(latest.messages) == shape(history)


async def stream_second_request(run: AgentRun[None, Any], act: Callable[[Any], Awaitable[None]]) -> None:
    """Iterate `run`, handing the stream of its second model request to `act`; return when `act` says so."""
    requests = 0
    async for node in run:
        if Agent.is_model_request_node(node):
            requests += 1
            if requests == 2:
                async with node.stream(run.ctx) as stream:
                    if await act(stream):
                        return


@scenario
async def iter_node_stream_cancelled(store: StepStore) -> None:
    async def cancel_at_the_second_word(stream: Any) -> bool:
        words = 0
        async for _ in stream.stream_text(delta=True, debounce_by=None):
            words += 1
            if words == 2:
                await stream.cancel()
                break
        return False

    async with persisted(store, model(LOOKUP, text(FULL))).iter('go') as run:
        await stream_second_request(run, cancel_at_the_second_word)
    # `AgentStream.cancel()` stops the response, not the run: pydantic-ai ends it with the text so far.
    assert run.result is not None and FULL.startswith(run.result.output) and run.result.output != FULL
    audit = await audit_only_run(store)
    assert audit.kinds[-3:] == ['model_request_started', 'model_request_failed', 'run_completed']
    assert audit.latest is not None and dump(audit.latest.messages) == dump(run.result.all_messages())


@scenario
async def iter_node_stream_cancelled_then_left(store: StepStore) -> None:
    outputs: list[Any] = []

    async def cancel_then_read(stream: Any) -> bool:
        await anext(aiter(stream.stream_text(debounce_by=None)))
        await stream.cancel()
        outputs.append(await stream.get_output())
        return True

    async def cancel_only(stream: Any) -> bool:
        await anext(aiter(stream.stream_text(debounce_by=None)))
        await stream.cancel()
        return True

    for conversation, act in [('read', cancel_then_read), ('unread', cancel_only)]:
        async with persisted(store, model(LOOKUP, text(FULL))).iter('go', conversation_id=conversation) as run:
            await stream_second_request(run, act)
    read, unread = await audit_store(store)
    # Left with an output read from the cancelled stream, the run ended with it; left without, it has none.
    assert read.terminal.kind == 'run_completed' and read.latest is not None
    assert last_text(read.latest.messages) == outputs[0]
    assert unread.terminal.kind == 'run_failed' and unread.terminal.error == STREAM_CANCELLED


@scenario
async def run_stream_output_tool_abandoned(store: StepStore) -> None:
    final = calls(('final_result', {'value': 'a long answer'}, 'out-1'))
    agent = persisted(store, model(LOOKUP, final), output_type=Answer)
    async with agent.run_stream('go') as stream:
        async for _ in stream.stream_output(debounce_by=None):
            break
    audit = await audit_only_run(store)
    assert audit.kinds[-2:] == ['model_request_failed', 'run_failed']
    latest, complete = audit.latest, audit.latest_complete
    assert latest is not None and latest.state == 'interrupted'
    assert isinstance(latest.messages[-1], ModelResponse) and latest.messages[-1].state == 'interrupted'
    assert complete is not None and complete.step_index == 1 and len(complete.messages) == 3
    # pydantic-ai closes a cut-off response's calls when a new prompt follows it.
    result = await Agent(model(text('again'))).run('go on', message_history=latest.messages)
    assert result.output == 'again'


@scenario
async def run_stream_events_snapshots_match_the_store(store: StepStore) -> None:
    agent = persisted(store, model(LOOKUP, calls(('lookup', {'key': 'b'}, 'lookup-2')), text('done')))
    saved: list[SnapshotSaved] = []
    async with agent.run_stream_events('go', conversation_id='conv') as events:
        async for event in events:
            if isinstance(event, SnapshotSaved):
                saved.append(event)
    audit = await audit_only_run(store)
    stored = [(s.run_id, s.conversation_id, s.step_index, s.state) for s in audit.snapshots]
    streamed = [(e.run_id, e.conversation_id, e.step_index, e.state) for e in saved]
    # Every snapshot written during the run's steps reached the stream, in order; only the final
    # one is written after the stream has closed.
    assert streamed == stored[:-1] and len(stored) == 3


@scenario
async def iter_to_the_end(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text('done'))).iter('go') as run:
        async for _ in run:
            pass
    audit = await audit_only_run(store)
    assert audit.terminal.kind == 'run_completed'
    assert run.result is not None and audit.latest is not None
    assert dump(audit.latest.messages) == dump(run.result.all_messages())


async def iterate_until(run: AgentRun[None, Any], stop: Callable[[Any, list[Any]], bool]) -> None:
    seen: list[Any] = []
    async for node in run:
        if stop(node, seen):
            return
        seen.append(node)


@scenario
async def iter_left_after_a_tool_cycle(store: StepStore) -> None:
    async with persisted(store, model(LOOKUP, text('done'))).iter('go') as run:
        await iterate_until(run, lambda node, seen: Agent.is_model_request_node(node) and len(seen) > 2)
    audit = await audit_only_run(store)
    assert audit.kinds == [*TOOL_CYCLE_EVENTS[:-1], 'run_failed']
    assert audit.statuses() == {'lookup-1': 'completed'}
    # One snapshot: the tool cycle's. The run stopped with that history, return included.
    [snapshot] = audit.snapshots
    assert snapshot.state == 'complete' and successful_returns(snapshot.messages) == {'lookup-1': 'value of a'}
    assert audit.continued is not None  # resumed with no new prompt: the model gets the return
    # Whichever way a caller looks for the point to resume from, it holds the call that already happened.
    for history in [
        await continue_run(store, run_id=audit.run.run_id),
        await continue_run(store, run_id=audit.run.run_id, include_interrupted=True),
    ]:
        assert successful_returns(history) == {'lookup-1': 'value of a'}


@scenario
async def iter_left_before_the_tools_ran(store: StepStore) -> None:
    agent = persisted(store, model(LOOKUP, text('done')))
    async with agent.iter('go') as run:
        await iterate_until(run, lambda node, seen: Agent.is_call_tools_node(node))
    audit = await audit_only_run(store)
    assert audit.kinds == ['run_started', 'model_request_started', 'model_request_completed', 'run_failed']
    assert audit.effects == {}
    [snapshot] = audit.snapshots
    assert snapshot.state == 'interrupted' and unanswered_tool_call_ids(snapshot.messages) == ['lookup-1']
    # The call never started: continuing with no new prompt runs it, in the new run.
    history = await continue_run(store, run_id=audit.run.run_id, include_interrupted=True)
    assert (await agent.run(message_history=history)).output == 'done'
    [_, second] = await audit_store(store)
    assert second.statuses() == {'lookup-1': 'completed'} and second.terminal.kind == 'run_completed'


def deferring_agent(store: StepStore, steps: Sequence[ModelResponse]) -> Agent[None, Any]:
    agent = persisted(store, model(*steps), output_type=[str, DeferredToolRequests])

    @agent.tool_plain(requires_approval=True)
    async def delete(path: str) -> str:
        return f'deleted {path}'

    @agent.tool
    async def publish(ctx: RunContext[None], page: str) -> str:
        if not ctx.tool_call_approved:
            raise ApprovalRequired()
        return f'published {page}'

    @agent.tool_plain
    async def fetch(url: str) -> str:
        raise CallDeferred()

    return agent


async def pending_calls(store: StepStore, run_id: str) -> dict[str, str]:
    """The calls a paused run waits on, as docs/capability.md finds them: call id -> 'approval' | 'external'."""
    snapshot = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    assert snapshot is not None
    pending = {}
    for call_id in unanswered_tool_call_ids(snapshot.messages):
        effect = await store.get_tool_effect(run_id=run_id, tool_call_id=call_id)
        if effect is None or 'ApprovalRequired' in (effect.effect_summary or ''):
            pending[call_id] = 'approval'
        else:
            pending[call_id] = 'external'
    return pending


async def deferred_then_resumed(store: StepStore, call: ModelResponse, results: DeferredToolResults) -> list[Audit]:
    agent = deferring_agent(store, [call, text('done')])
    first = await agent.run('go', conversation_id='conv')
    assert isinstance(first.output, DeferredToolRequests)
    [paused] = await audit_store(store)
    assert paused.terminal.kind == 'run_completed'
    assert paused.latest is not None and paused.latest.state == 'interrupted' and paused.latest_complete is None
    history = await continue_run(store, run_id=paused.run.run_id, include_interrupted=True)
    second = await agent.run(message_history=history, deferred_tool_results=results, conversation_id='conv')
    assert second.output == 'done'
    audits = await audit_store(store)
    assert audits[1].terminal.kind == 'run_completed' and audits[1].latest_complete is not None
    return [paused, audits[1]]


@scenario
async def deferred_requires_approval(store: StepStore) -> None:
    call = calls(('delete', {'path': '/tmp/x'}, 'delete-1'))
    paused, resumed = await deferred_then_resumed(store, call, DeferredToolResults(approvals={'delete-1': True}))
    assert paused.effects == {}  # never started: no ledger record, no event
    assert await pending_calls(store, paused.run.run_id) == {'delete-1': 'approval'}
    assert resumed.statuses() == {'delete-1': 'completed'}
    assert resumed.latest is not None and successful_returns(resumed.latest.messages)['delete-1'] == 'deleted /tmp/x'


@scenario
async def deferred_approval_required_raised(store: StepStore) -> None:
    call = calls(('publish', {'page': 'home'}, 'publish-1'))
    paused, resumed = await deferred_then_resumed(store, call, DeferredToolResults(approvals={'publish-1': True}))
    [record] = paused.effects.values()
    assert record.status == 'failed' and (record.effect_summary or '').startswith('deferred')
    assert await pending_calls(store, paused.run.run_id) == {'publish-1': 'approval'}
    assert resumed.statuses() == {'publish-1': 'completed'}


@scenario
async def deferred_call_deferred_raised(store: StepStore) -> None:
    call = calls(('fetch', {'url': 'https://example.com'}, 'fetch-1'))
    paused, resumed = await deferred_then_resumed(store, call, DeferredToolResults(calls={'fetch-1': 'fetched'}))
    assert paused.statuses() == {'fetch-1': 'failed'}
    assert await pending_calls(store, paused.run.run_id) == {'fetch-1': 'external'}
    assert resumed.effects == {}  # the result came from outside: nothing ran in the second run
    assert resumed.latest is not None and successful_returns(resumed.latest.messages)['fetch-1'] == 'fetched'


@scenario
async def deferred_resumed_with_the_conversation_object(store: StepStore) -> None:
    agent = deferring_agent(store, [calls(('delete', {'path': '/tmp/x'}, 'delete-1')), text('done')])
    first = await agent.run('go', conversation_id='conv')
    assert isinstance(first.output, DeferredToolRequests)
    approved = DeferredToolResults(approvals={'delete-1': True})
    assert (await agent.run(conversation=first.conversation, deferred_tool_results=approved)).output == 'done'
    paused, resumed = await audit_store(store)
    assert paused.effects == {} and resumed.statuses() == {'delete-1': 'completed'}
    assert resumed.run.conversation_id == 'conv' and resumed.terminal.kind == 'run_completed'


@scenario
async def output_validator_retries(store: StepStore) -> None:
    agent = persisted(store, model(LOOKUP, text('bad'), text('good')))

    @agent.output_validator
    def validate(output: str) -> str:
        if output.strip() == 'bad':
            raise ModelRetry('not good enough')
        return output

    assert (await agent.run('go')).output == 'good'
    audit = await audit_only_run(store)
    assert audit.kinds.count('model_request_started') == 3 and audit.terminal.kind == 'run_completed'
    assert [s.state for s in audit.snapshots] == ['complete'] * 3


@scenario
async def usage_limit_exceeded(store: StepStore) -> None:
    agent = persisted(store, model(LOOKUP, text('done')))
    with pytest.raises(UsageLimitExceeded):
        await agent.run('go', usage_limits=UsageLimits(request_limit=1))
    audit = await audit_only_run(store)
    assert 'UsageLimitExceeded' in (audit.terminal.error or '') and audit.terminal.kind == 'run_failed'
    assert audit.statuses() == {'lookup-1': 'completed'}
    assert audit.latest is not None and audit.latest.state == 'complete'


@scenario
async def tool_call_limit_exceeded(store: StepStore) -> None:
    agent = persisted(store, model(LOOKUP, calls(('lookup', {'key': 'b'}, 'lookup-2')), text('done')))
    with pytest.raises(UsageLimitExceeded):
        await agent.run('go', usage_limits=UsageLimits(tool_calls_limit=1))
    audit = await audit_only_run(store)
    assert audit.kinds[-2:] == ['model_request_completed', 'run_failed']
    assert audit.statuses() == {'lookup-1': 'completed'}
    # The refused call never started. As in pydantic-ai's history, the failure snapshot ends with the interruption
    # marker; the newest complete one is the settled cycle.
    latest, complete = audit.latest, audit.latest_complete
    assert latest is not None and latest.state == 'interrupted'
    assert unanswered_tool_call_ids(latest.messages) == ['lookup-2']
    assert isinstance(latest.messages[-1], ModelRequest) and latest.messages[-1].state == 'interrupted'
    assert complete is not None and successful_returns(complete.messages) == {'lookup-1': 'value of a'}
    # Continued from the failure snapshot, the refused call is closed, not run.
    history = await continue_run(store, run_id=audit.run.run_id, include_interrupted=True)
    again = persisted(store, model(text('after')))
    assert (await again.run(message_history=history)).output == 'after'
    [_, continued] = await audit_store(store)
    assert continued.effects == {} and continued.latest is not None
    assert returns_in(continued.latest.messages) == {'lookup-1': 'value of a', 'lookup-2': INTERRUPTED_RETURN}


@scenario
async def token_limit_exceeded(store: StepStore) -> None:
    agent = persisted(store, model(LOOKUP, text('done')))
    with pytest.raises(UsageLimitExceeded):
        await agent.run('go', usage_limits=UsageLimits(output_tokens_limit=1))
    audit = await audit_only_run(store)
    assert audit.kinds[-2:] == ['model_request_completed', 'run_failed'] and audit.effects == {}
    # The response that crossed the limit is kept, as pydantic-ai keeps it, marked interrupted.
    assert audit.latest is not None and audit.latest.state == 'interrupted'
    assert isinstance(audit.latest.messages[-1], ModelResponse) and audit.latest.messages[-1].state == 'interrupted'
    # Continued with no prompt, a run acts on that response and runs its call; a new prompt closes the call instead.
    history = await continue_run(store, run_id=audit.run.run_id, include_interrupted=True)
    await persisted(store, model(text('after'))).run(message_history=history)
    await persisted(store, model(text('after'))).run('go on', message_history=history)
    [_, acted, closed] = await audit_store(store)
    assert acted.statuses() == {'lookup-1': 'completed'} and closed.effects == {}
    assert closed.latest is not None and returns_in(closed.latest.messages) == {'lookup-1': INTERRUPTED_RETURN}


async def hanging_tool_agent(store: StepStore, entered: asyncio.Event, **options: Any) -> Agent[None, Any]:
    agent = persisted(store, model(LOOKUP, calls(('hang', {}, 'hang-1')), text('never')), **options)

    @agent.tool_plain
    async def hang() -> str:
        entered.set()
        await asyncio.Event().wait()
        return 'unreachable'

    return agent


def assert_cancelled_in_tool(audit: Audit, error: str) -> None:
    assert audit.kinds[-3:] == ['tool_call_started', 'tool_call_failed', 'run_failed']
    assert audit.terminal.error == error and audit.events[-2].error == error
    assert audit.statuses() == {'lookup-1': 'completed', 'hang-1': 'failed'}
    assert 'cancelled' in (audit.effects['hang-1'].effect_summary or '')
    latest = audit.latest
    assert latest is not None and latest.state == 'interrupted'
    # pydantic-ai's marker of an interrupted tool cycle ends the history: a later run closes the
    # call with an `interrupted` return instead of running it again.
    assert isinstance(latest.messages[-1], ModelRequest) and latest.messages[-1].state == 'interrupted'


def assert_cancelled_in_model_request(audit: Audit, error: str) -> None:
    assert audit.kinds[-3:] == ['model_request_started', 'model_request_failed', 'run_failed']
    assert audit.terminal.error == error and audit.events[-2].error == error
    assert audit.latest is not None and audit.latest.state == 'complete'


async def cancel_when(task: asyncio.Task[Any], event: asyncio.Event) -> None:
    await event.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@scenario
async def cancelled_in_a_tool(store: StepStore) -> None:
    entered = asyncio.Event()
    agent = await hanging_tool_agent(store, entered)
    await cancel_when(asyncio.create_task(agent.run('go')), entered)
    audit = await audit_only_run(store)
    assert_cancelled_in_tool(audit, 'CancelledError()')
    # Continued from the failure snapshot, the cancelled call is closed, not run again.
    history = await continue_run(store, run_id=audit.run.run_id, include_interrupted=True)
    again = persisted(store, model(text('after')))

    @again.tool_plain
    async def hang() -> str:
        raise AssertionError('a cancelled call is run again')

    assert (await again.run(message_history=history)).output == 'after'
    [_, continued] = await audit_store(store)
    assert continued.effects == {} and continued.latest is not None
    assert returns_in(continued.latest.messages) == {'lookup-1': 'value of a', 'hang-1': INTERRUPTED_RETURN}


@scenario
async def cancelled_in_a_model_request(store: StepStore) -> None:
    script = Script([LOOKUP, text('never')], block_at=1)
    await cancel_when(asyncio.create_task(persisted(store, script).run('go')), script.entered)
    audit = await audit_only_run(store)
    assert_cancelled_in_model_request(audit, 'CancelledError()')
    assert audit.statuses() == {'lookup-1': 'completed'}


TIMED_OUT = repr(RunTimedOut('The agent run timed out.'))


CANCELLED = repr(RunCancelled('The agent run was cancelled.'))


@scenario
async def cancelled_with_a_token_in_a_model_request(store: StepStore) -> None:
    script = Script([LOOKUP, text('never')], block_at=1)
    token = CancellationToken()
    task = asyncio.create_task(persisted(store, script).run('go', cancellation_token=token))
    await script.entered.wait()
    token.cancel()
    with pytest.raises(RunCancelled):
        await task
    audit = await audit_only_run(store)
    assert_cancelled_in_model_request(audit, CANCELLED)
    assert audit.statuses() == {'lookup-1': 'completed'}


@scenario
async def agent_run_cancelled_in_a_tool(store: StepStore) -> None:
    entered = asyncio.Event()
    agent = await hanging_tool_agent(store, entered)

    async def drive_cancelled_in_the_tool() -> None:
        async with agent.iter('go') as run:
            canceller = asyncio.create_task(entered.wait())
            canceller.add_done_callback(lambda _: run.cancel())
            async for _ in run:
                pass

    with pytest.raises(RunCancelled):
        await drive_cancelled_in_the_tool()
    audit = await audit_only_run(store)
    assert_cancelled_in_tool(audit, CANCELLED)
    assert 'the run was cancelled' in (audit.effects['hang-1'].effect_summary or '')


@scenario
async def cancelled_by_the_application(store: StepStore) -> None:
    agent = persisted(store, model(LOOKUP, calls(('stop', {}, 'stop-1')), text('never')))

    @agent.tool
    async def stop(ctx: RunContext[None]) -> str:
        ctx.cancel()
        await asyncio.Event().wait()
        return 'unreachable'

    with pytest.raises(RunCancelled):
        await agent.run('go')
    audit = await audit_only_run(store)
    assert audit.kinds[-2:] == ['tool_call_failed', 'run_failed'] and audit.terminal.error == CANCELLED
    assert 'the run was cancelled' in (audit.effects['stop-1'].effect_summary or '')


@scenario
async def timeout_in_a_tool(store: StepStore) -> None:
    entered = asyncio.Event()
    with pytest.raises(RunTimedOut):
        await (await hanging_tool_agent(store, entered)).run('go', timeout=0.5)
    audit = await audit_only_run(store)
    assert audit.terminal.error == TIMED_OUT
    if entered.is_set():
        assert_cancelled_in_tool(audit, TIMED_OUT)
        assert 'timed out' in (audit.effects['hang-1'].effect_summary or '')


@scenario
async def timeout_in_a_model_request(store: StepStore) -> None:
    script = Script([LOOKUP, text('never')], block_at=1)
    with pytest.raises(RunTimedOut):
        await persisted(store, script).run('go', timeout=0.5)
    audit = await audit_only_run(store)
    assert audit.terminal.error == TIMED_OUT
    if script.entered.is_set():
        assert_cancelled_in_model_request(audit, TIMED_OUT)


@scenario
async def toolsets_on_the_agent_and_per_run(store: StepStore) -> None:
    async def search(query: str) -> str:
        return f'found {query}'

    async def fetch(url: str) -> str:
        return f'page {url}'

    both = calls(('search', {'query': 'q'}, 'search-1'), ('fetch', {'url': 'u'}, 'fetch-1'))
    agent = persisted(store, model(both, text('done')), toolsets=[FunctionToolset([search])])
    await agent.run('go', toolsets=[FunctionToolset([fetch])])
    audit = await audit_only_run(store)
    assert audit.statuses() == {'search-1': 'completed', 'fetch-1': 'completed'}
    assert audit.latest is not None
    assert successful_returns(audit.latest.messages) == {'search-1': 'found q', 'fetch-1': 'page u'}


@scenario
async def override_model(store: StepStore) -> None:
    agent = persisted(store, model(text('from the agent model')))
    with agent.override(model=model(LOOKUP, text('from the override'))):
        result = await agent.run('go')
    assert result.output == 'from the override'
    audit = await audit_only_run(store)
    assert audit.statuses() == {'lookup-1': 'completed'}
    assert audit.latest is not None and dump(audit.latest.messages) == dump(result.all_messages())


@pytest.mark.parametrize('name', sorted(SCENARIOS))
async def test_entry_point(name: str, make_store: StoreMaker) -> None:
    await SCENARIOS[name](await make_store())


# --- timing: the same scenarios, 20 times, stopping at different points ---


class SignallingStore(RecordingStore):
    """A pass-through store that sets an event as each kind of event is written."""

    def __init__(self, inner: StepStore) -> None:
        super().__init__(inner)
        self.written: dict[str, asyncio.Event] = {}

    def when(self, kind: str) -> asyncio.Event:
        return self.written.setdefault(kind, asyncio.Event())

    async def append_event(self, event: StepEvent) -> None:
        await super().append_event(event)
        self.when(event.kind).set()


async def read_some(chunks: AsyncIterator[Any], count: int) -> None:
    for _ in range(count):
        try:
            await anext(chunks)
        except StopAsyncIteration:
            return


async def test_abandoned_streams_repeatedly(make_store: StoreMaker) -> None:
    """Leave text and output-tool streams after 0, 1, ... chunks, up to reading them whole."""
    store = await make_store()
    words = ' '.join(f'w{index}' for index in range(8))
    for iteration in range(20):
        structured = iteration % 2 == 1
        final = calls(('final_result', {'value': words}, 'out-1')) if structured else text(words)
        agent = persisted(store, model(LOOKUP, final), output_type=Answer if structured else str)
        async with agent.run_stream('go', conversation_id=f'conv-{iteration}') as stream:
            chunks = stream.stream_output(debounce_by=None) if structured else stream.stream_text(debounce_by=None)
            await read_some(aiter(chunks), iteration // 2)
            consumed = stream.is_complete
        [run] = await store.list_runs(conversation_id=f'conv-{iteration}')
        audit = await audit_run(store, run.run_id)
        assert audit.terminal.kind == ('run_completed' if consumed else 'run_failed'), iteration


async def test_cancellations_repeatedly(make_store: StoreMaker) -> None:
    """Cancel a run at 20 points: as each kind of its writes lands, in a model request, in a tool."""
    store = SignallingStore(await make_store())
    points = ['run_started', 'model_request_started', 'model_request_completed', 'tool_call_started']
    points += ['tool_call_completed', 'in_model_request', 'in_tool']
    for iteration in range(20):
        point = points[iteration % len(points)]
        store.written.clear()
        entered = asyncio.Event()
        if point == 'in_model_request':
            script = Script([LOOKUP, text('never')], block_at=1)
            agent, entered = persisted(store, script), script.entered
        else:
            agent = await hanging_tool_agent(store, entered)
        condition = entered if point.startswith('in_') else store.when(point)
        task = asyncio.create_task(agent.run('go', conversation_id=f'conv-{iteration}'))
        await condition.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        [run] = await store.list_runs(conversation_id=f'conv-{iteration}')
        audit = await audit_run(store, run.run_id)
        assert audit.terminal.kind == 'run_failed' and audit.terminal.error == 'CancelledError()', (point, audit.kinds)


def timeouts() -> Iterator[tuple[int, float]]:
    """`(iteration, timeout)`: 0.05 s, 0.05 s, 0.1 s, 0.1 s, ... 0.5 s, then doubling up to 8 s (for a loaded machine,
    where a run may need longer than 0.5 s to reach its tool: the caller stops once it has seen what it needs)."""
    for iteration in range(20):
        yield iteration, 0.05 * (1 + iteration // 2)
    for iteration in range(20, 28):
        yield iteration, 0.5 * 2 ** ((iteration - 18) // 2)


async def test_timeouts_repeatedly(make_store: StoreMaker) -> None:
    """Time runs out after 0.05 s, 0.1 s, ... 0.5 s: before the run is registered, in a model request, in a tool."""
    store = await make_store()
    reached: set[str] = set()
    for iteration, timeout in timeouts():
        if iteration >= 20 and reached == {'tool', 'model request'}:
            break
        in_tool = iteration % 2 == 0
        entered = asyncio.Event()
        if in_tool:
            agent = await hanging_tool_agent(store, entered)
        else:
            script = Script([LOOKUP, text('never')], block_at=1)
            agent, entered = persisted(store, script), script.entered
        with pytest.raises(RunTimedOut):
            await agent.run('go', timeout=timeout, conversation_id=f'conv-{iteration}')
        runs = await store.list_runs(conversation_id=f'conv-{iteration}')
        if not runs:
            continue  # timed out before its record was written: nothing is
        audit = await audit_run(store, runs[0].run_id)
        assert audit.terminal.error == TIMED_OUT
        if entered.is_set():
            reached.add('tool' if in_tool else 'model request')
            (assert_cancelled_in_tool if in_tool else assert_cancelled_in_model_request)(audit, TIMED_OUT)
    assert reached == {'tool', 'model request'}, 'a timeout landed in each'


# --- run_sync: the store used from several event loops in turn ---


@contextmanager
def store_beside_event_loops(backend: Backend, request: pytest.FixtureRequest) -> Iterator[StepStore]:
    """A store of `backend` for a sync test: its backend session lives on a blocking portal's event loop."""
    if backend.name in LOOP_BOUND:
        request.applymarker(pytest.mark.xfail(strict=True, raises=RuntimeError, reason=LOOP_BOUND[backend.name]))
    for fixture in SERVER_FIXTURES.get(backend.name, ()):
        request.getfixturevalue(fixture)  # set up here, not from the portal's thread
    request.getfixturevalue('tmp_path')
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(backend.open(request)) as session:
        store = portal.call(session.make)
        yield store
        asyncio.run(store.aclose())


def test_run_sync_alternating_with_asyncio_run(any_backend: Backend, request: pytest.FixtureRequest) -> None:
    """Turns of a chat with `run_sync`, each read back and continued with `asyncio.run`.

    `run_sync` drives the thread's event loop; every `asyncio.run` makes a new one; the backend's
    session lives on a third (a blocking portal's). The store is used from each in turn (on every
    client library: what binds to a loop is the client's).
    """
    with store_beside_event_loops(any_backend, request) as store:
        agent = persisted(store, model(LOOKUP, text('done')))
        history: list[ModelMessage] | None = None
        for turn in range(3):
            result = agent.run_sync(f'turn {turn}', message_history=history, conversation_id='conv')
            runs = asyncio.run(store.list_runs(conversation_id='conv'))
            assert len(runs) == turn + 1
            audit = asyncio.run(audit_run(store, runs[-1].run_id))
            assert audit.terminal.kind == 'run_completed' and audit.latest is not None
            assert dump(audit.latest.messages) == dump(result.all_messages())
            history = asyncio.run(continue_run(store, run_id=runs[-1].run_id))


def test_run_stream_sync_text_and_structured(any_backend: Backend, request: pytest.FixtureRequest) -> None:
    """`run_stream_sync` read to the end, the chat continued from the store, then a second stream left early;
    and a structured output read to the end."""
    with store_beside_event_loops(any_backend, request) as store:
        agent = persisted(store, model(LOOKUP, text('one two three'), text('four five six seven')))
        with agent.run_stream_sync('go', conversation_id='conv') as whole:
            assert whole.get_output() == 'one two three'
        [first] = asyncio.run(store.list_runs(conversation_id='conv'))
        history = asyncio.run(continue_run(store, run_id=first.run_id))
        assert dump(history) == dump(whole.all_messages())
        with agent.run_stream_sync('more', message_history=history, conversation_id='conv') as left:
            seen = next(iter(left.stream_text(debounce_by=None)))
        consumed, abandoned = asyncio.run(audit_store(store))
        assert consumed.kinds == [*TOOL_CYCLE_EVENTS, 'model_request_completed', 'run_completed']
        assert abandoned.kinds[-3:] == ['model_request_started', 'model_request_failed', 'run_failed']
        latest = abandoned.latest
        assert latest is not None and latest.state == 'complete'
        [*_, response] = latest.messages
        assert isinstance(response, ModelResponse) and response.state == 'interrupted'
        assert (response.text or '').startswith(seen) and response.text != 'four five six seven'

        final = calls(('final_result', {'value': 'v'}, 'out-1'))
        structured = persisted(store, model(LOOKUP, final), output_type=Answer)
        with structured.run_stream_sync('shape it', conversation_id='structured') as answered:
            assert answered.get_output() == Answer(value='v')
        [run] = asyncio.run(store.list_runs(conversation_id='structured'))
        audit = asyncio.run(audit_run(store, run.run_id))
        assert audit.latest is not None and audit.latest.state == 'complete'
        assert shape(audit.latest.messages) == shape(answered.all_messages()) and len(audit.latest.messages) == 5


SERVER_FIXTURES = {'postgres': ('postgres_server',), 'mongo': ('mongo_server',), 'motor': ('mongo_server',)}
LOOP_BOUND = {
    'motor': (
        "the motor backend's stores are given the test's motor client, which belongs to the loop of its first use, and "
        "a caller's client is never replaced (docs/mongo.md): after the first run_sync, asyncio.run(store.list_runs()) "
        'raises "RuntimeError: Task <... MongoStepStore.list_runs() ...> got Future <Future pending> attached to a '
        'different loop"'
    ),
}
"""Backends whose store cannot be used from another event loop than its first one: their stores are given a client."""
