"""The pydantic-ai behaviours StepPersistence relies on, each pinned on its own.

If an upgrade of pydantic-ai changes one of them, the test named after it fails, pointing at the
place in src/step_persistence/capability.py that depends on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext, capture_run_messages
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.run import AgentRunResult

from step_persistence import InMemoryStepStore, StepPersistence, is_provider_valid
from step_persistence import capability as persistence

pytestmark = pytest.mark.anyio


def calls(*tool_calls: tuple[str, dict[str, Any], str]) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(name, args, call_id) for name, args, call_id in tool_calls])


def text(content: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


def streaming(*steps: ModelResponse, block: bool = False) -> FunctionModel:
    """Answers the n-th request with `steps[n]`; streams text word by word; `block` makes requests wait forever."""
    served: list[int] = []

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        served.append(1)
        if block:
            await asyncio.Event().wait()
        return steps[min(len(served) - 1, len(steps) - 1)]

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        response = await respond(messages, info)
        for index, part in enumerate(response.parts):
            if isinstance(part, TextPart):
                for position, word in enumerate(part.content.split(' ')):
                    yield f' {word}' if position else word
            elif isinstance(part, ToolCallPart):
                yield {
                    index: DeltaToolCall(
                        name=part.tool_name, json_args=part.args_as_json_str(), tool_call_id=part.tool_call_id
                    )
                }

    return FunctionModel(respond, stream_function=stream)


class Answer(BaseModel):
    value: str


@dataclass
class Witness(AbstractCapability[Any]):
    """Records what the hooks see: the run's history at its end, the order of hook calls, the run's error."""

    history: list[ModelMessage] = field(default_factory=list[ModelMessage])
    order: list[str] = field(default_factory=list[str])
    errors: list[BaseException] = field(default_factory=list[BaseException])
    timed_out: list[bool] = field(default_factory=list[bool])
    tasks: dict[str, asyncio.Task[Any] | None] = field(default_factory=dict[str, 'asyncio.Task[Any] | None'])

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        self.history = list(result.all_messages())
        return result

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        self.tasks['run'] = asyncio.current_task()
        try:
            return await handler()
        except BaseException as error:
            self.errors.append(error)
            self.timed_out.append(getattr(ctx.__dict__.get('_cancellation'), 'timed_out', False))
            raise

    async def wrap_model_request(self, ctx: RunContext[Any], *, request_context: Any, handler: Any) -> Any:
        self.tasks['model_request'] = asyncio.current_task()
        response = await handler(request_context)
        self.order.append('model request handler returned')
        return response

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: Any, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        self.order.append(f'tool {call.tool_call_id} started')
        return await handler(args)


async def test_run_stream_adds_the_output_tool_return_to_the_stream_result_only() -> None:
    """capability.py `_answer_final_output`: the run's own history ends with the unanswered output call."""
    witness = Witness()
    agent = Agent(
        streaming(calls(('final_result', {'value': 'v'}, 'out-1'))), output_type=Answer, capabilities=[witness]
    )
    async with agent.run_stream('go') as stream:
        await stream.get_output()
    [*_, response, answer] = stream.all_messages()
    assert isinstance(answer, ModelRequest)
    assert [(p.tool_name, p.content, p.tool_call_id) for p in answer.parts if isinstance(p, ToolReturnPart)] == [
        ('final_result', 'Final result processed.', 'out-1')
    ]
    assert witness.history[-1] == response and not is_provider_valid(witness.history)
    # `run` adds the same request to the run's history.
    result = await Agent(streaming(calls(('final_result', {'value': 'v'}, 'out-1'))), output_type=Answer).run('go')
    assert isinstance(result.all_messages()[-1], ModelRequest) and is_provider_valid(result.all_messages())


def test_the_returns_of_a_final_response_are_worded_as_pydantic_ai_words_them() -> None:
    """capability.py rebuilds them with these words; pydantic-ai keeps them in `_tool_execution`."""
    from pydantic_ai import _tool_execution as execution

    assert persistence._FINAL_RESULT_PROCESSED == execution._FINAL_RESULT_PROCESSED
    assert persistence._OUTPUT_NOT_USED == execution._OUTPUT_SKIPPED_FINAL_ALREADY_PROCESSED
    assert persistence._OUTPUT_NOT_FINAL == execution._OUTPUT_NOT_FINAL_RESULT
    assert persistence._TOOL_NOT_EXECUTED == execution._TOOL_SKIPPED_FINAL_ALREADY_PROCESSED


@pytest.mark.parametrize('end_strategy', ['graceful', 'early', 'exhaustive'])
@pytest.mark.parametrize(
    'final',
    [
        calls(('final_result', {'value': 'v'}, 'out-1'), ('lookup', {'key': 'k'}, 'call-1')),
        calls(('lookup', {'key': 'k'}, 'call-1'), ('final_result', {'value': 'v'}, 'out-1')),
        calls(('final_result', {'value': 'v'}, 'out-1'), ('final_result', {'value': 'w'}, 'out-2')),
    ],
    ids=['output-then-function', 'function-then-output', 'two-outputs'],
)
async def test_the_final_snapshot_of_a_stream_answers_its_calls_as_the_stream_result_does(
    end_strategy: Any, final: ModelResponse
) -> None:
    store = InMemoryStepStore()
    agent = Agent(
        streaming(final), output_type=Answer, end_strategy=end_strategy, capabilities=[StepPersistence(store=store)]
    )

    @agent.tool_plain
    async def lookup(key: str) -> str:
        return f'value of {key}'

    async with agent.run_stream('go') as stream:
        await stream.get_output()
    [run] = await store.list_runs()
    latest = await store.latest_snapshot(run_id=run.run_id)
    assert latest is not None

    def answers(messages: list[ModelMessage]) -> list[tuple[str, Any, str]]:
        answer = messages[-1]
        assert isinstance(answer, ModelRequest)
        return [(p.tool_name, p.content, p.outcome) for p in answer.parts if isinstance(p, ToolReturnPart)]

    assert answers(latest.messages) == answers(stream.all_messages())


async def test_run_stream_runs_the_final_calls_before_the_model_request_handler_returns() -> None:
    """capability.py `wrap_tool_execute` closes the model request in flight when a call starts."""
    witness = Witness()
    final = calls(('lookup', {'key': 'k'}, 'call-1'), ('final_result', {'value': 'v'}, 'out-1'))
    agent = Agent(streaming(final), output_type=Answer, capabilities=[witness])

    @agent.tool_plain
    async def lookup(key: str) -> str:
        return key

    async with agent.run_stream('go') as stream:
        await stream.get_output()
    assert witness.order == ['tool call-1 started', 'model request handler returned']


async def test_iter_left_after_a_tool_cycle_keeps_the_returns_out_of_the_history() -> None:
    """capability.py `_failure_history` folds the pending request in."""
    agent = Agent(streaming(calls(('lookup', {'key': 'k'}, 'call-1')), text('done')))

    @agent.tool_plain
    async def lookup(key: str) -> str:
        return key

    async with agent.iter('go') as run:
        async for node in run:
            if Agent.is_call_tools_node(node):
                next_node = await run.next(node)
                break
    assert Agent.is_model_request_node(next_node)
    assert isinstance(run.all_messages()[-1], ModelResponse)
    assert [p.tool_call_id for p in next_node.request.parts if isinstance(p, ToolReturnPart)] == ['call-1']


async def test_a_stream_left_early_leaves_its_response_incomplete_in_the_history() -> None:
    """capability.py `_failure_history` records it as `interrupted`; `wrap_model_request` sees it come back."""
    with capture_run_messages() as messages:
        async with Agent(streaming(text('one two three four'))).run_stream('go') as stream:
            await anext(aiter(stream.stream_text(debounce_by=None)))
    response = messages[-1]
    assert isinstance(response, ModelResponse) and response.state == 'incomplete'
    assert (response.text or '') != 'one two three four'


async def test_a_cancelled_tool_cycle_ends_the_history_with_an_interrupted_request() -> None:
    """capability.py `_failure_history` adds that marker when the snapshot is taken before pydantic-ai does."""
    entered = asyncio.Event()
    executions: list[int] = []
    agent = Agent(streaming(calls(('hang', {}, 'hang-1')), text('after')))

    @agent.tool_plain
    async def hang() -> str:
        executions.append(1)
        if len(executions) == 1:
            entered.set()
            await asyncio.Event().wait()
        return 'ran again'

    with capture_run_messages() as messages:
        task = asyncio.create_task(agent.run('go'))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    marker = messages[-1]
    assert isinstance(marker, ModelRequest) and marker.state == 'interrupted' and marker.parts == []
    # With the marker, a later run closes the call instead of running it again, with or without a prompt.
    for prompt in ('go on', None):
        result = await agent.run(prompt, message_history=list(messages))
        assert result.output == 'after' and executions == [1]
        closed = [p for m in result.all_messages() for p in getattr(m, 'parts', []) if isinstance(p, ToolReturnPart)]
        assert [(p.tool_call_id, p.outcome) for p in closed] == [('hang-1', 'interrupted')]
    # Without it, a run continuing with no prompt executes the open call.
    await agent.run(message_history=list(messages[:-1]))
    assert executions == [1, 1]


async def test_a_new_prompt_closes_the_calls_of_an_interrupted_response() -> None:
    """docs/capability.md: an abandoned output-tool stream continues with a new prompt."""
    cut = ModelResponse(parts=[ToolCallPart('final_result', '{"value": "par', 'out-1')], state='interrupted')
    history: list[ModelMessage] = [ModelRequest.user_text_prompt('go'), cut]
    result = await Agent(streaming(text('fine'))).run('again', message_history=history)
    assert result.output == 'fine'


async def test_hooks_see_a_timeout_as_a_cancellation_the_controller_knows_timed_out() -> None:
    """capability.py `_described` records `RunTimedOut` from the run's cancellation controller."""
    from pydantic_ai.exceptions import RunTimedOut

    witness = Witness()
    with pytest.raises(RunTimedOut):
        await Agent(streaming(text('never'), block=True), capabilities=[witness]).run('go', timeout=0.2)
    [error] = witness.errors
    assert isinstance(error, asyncio.CancelledError) and witness.timed_out == [True]


async def test_wrap_run_and_the_model_request_run_in_different_tasks() -> None:
    """capability.py `wrap_run` closes a model request that has not reached its own error handling."""
    witness = Witness()
    await Agent(streaming(text('hi')), capabilities=[witness]).run('go')
    assert witness.tasks['run'] is not None and witness.tasks['run'] is not witness.tasks['model_request']


@dataclass
class OutputWitness(Witness):
    """Also records each output `wrap_output_process` settles (not partial), and whether the model request was
    still streaming then (its handler not yet returned)."""

    outputs: list[tuple[Any, str | None, bool]] = field(default_factory=list[tuple[Any, str | None, bool]])

    async def wrap_output_process(self, ctx: RunContext[Any], *, output_context: Any, output: Any, handler: Any) -> Any:
        processed = await handler(output)
        if not ctx.partial_output:
            call = output_context.tool_call
            streaming = not any(entry.startswith('model request handler returned') for entry in self.order)
            self.outputs.append((processed, None if call is None else call.tool_call_id, streaming))
        return processed

    async def wrap_model_request(self, ctx: RunContext[Any], *, request_context: Any, handler: Any) -> Any:
        response = await handler(request_context)
        self.order.append(f'model request handler returned {response.state}')
        return response

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        try:
            return await handler()
        except BaseException as error:
            self.order.append(f'wrap_run raised {type(error).__name__}')
            raise


@pytest.mark.parametrize('read_output', [False, True], ids=['output-unread', 'output-read'])
@pytest.mark.parametrize('structured', [False, True], ids=['text', 'output-tool'])
async def test_a_cancelled_stream_ends_the_run_as_a_cancellation_whether_or_not_its_output_was_read(
    structured: bool, read_output: bool
) -> None:
    """capability.py `wrap_run`: after `StreamedRunResult.cancel()`, the run never reaches `after_run`.

    The model request's handler hands the response back `interrupted`, then `wrap_run` sees a
    `CancelledError`, whatever the caller did next. Read after `cancel()`, the output is settled
    (`wrap_output_process`, not partial, while the request still streams) and the caller holds it
    and `StreamedRunResult.result`; unread, the run has no result.
    """
    witness = OutputWitness()
    final = calls(('final_result', {'value': 'v w'}, 'out-1')) if structured else text('one two three')
    agent = Agent(streaming(final), output_type=Answer if structured else str, capabilities=[witness])
    async with agent.run_stream('go') as stream:
        await stream.cancel()
        output = await stream.get_output() if read_output else None
    assert witness.order == ['model request handler returned interrupted', 'wrap_run raised CancelledError']
    assert witness.history == []  # no `after_run`
    if read_output:
        assert stream.result.output == output == (Answer(value='v w') if structured else 'one two three')
        assert witness.outputs == [(output, 'out-1' if structured else None, True)]
    else:
        with pytest.raises(UserError, match='cancelled before it produced an output'):
            stream.result  # noqa: B018
        assert witness.outputs == []


async def test_a_stream_left_early_is_handed_back_incomplete_not_interrupted() -> None:
    """capability.py `wrap_model_request` tells a cancelled stream (`interrupted`) from one left early."""
    witness = OutputWitness()
    async with Agent(streaming(text('one two three four')), capabilities=[witness]).run_stream('go') as stream:
        await anext(aiter(stream.stream_text(debounce_by=None)))
    assert witness.order == ['model request handler returned incomplete', 'wrap_run raised CancelledError']


async def test_cancel_leaves_the_stream_result_with_the_response_as_it_was_then() -> None:
    """docs/capability.md: the record keeps the response the output came from, which `all_messages()` may not.

    `FunctionModel` has no connection for `cancel()` to close: read after it, its stream goes on to the end.
    """
    async with Agent(streaming(text('one two three four'))).run_stream('go') as stream:
        await anext(aiter(stream.stream_text(debounce_by=None)))
        await stream.cancel()
        assert await stream.get_output() == 'one two three four'
    response = stream.all_messages()[-1]
    assert isinstance(response, ModelResponse) and response.state == 'interrupted' and response.text == 'one'
