"""A scripted chat agent: each turn one tool call, then an answer (no network)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from step_persistence import StepPersistence, StepStore

__all__ = ['chat_agent', 'chat_turns']


def _one_tool_call_per_turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Answers a prompt with a call of `note`, and the note's return with a text."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    part = last.parts[-1]
    if isinstance(part, UserPromptPart):
        return ModelResponse(parts=[ToolCallPart('note', {'text': str(part.content)}, f'call-{len(messages)}')])
    assert isinstance(part, ToolReturnPart)
    return ModelResponse(parts=[TextPart(f'noted: {part.content}')])


async def _streamed(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    """`_one_tool_call_per_turn`, streamed."""
    response = _one_tool_call_per_turn(messages, info)
    for part in response.parts:
        if isinstance(part, TextPart):
            yield part.content
        elif isinstance(part, ToolCallPart):
            yield {
                0: DeltaToolCall(name=part.tool_name, json_args=part.args_as_json_str(), tool_call_id=part.tool_call_id)
            }


def chat_agent(store: StepStore) -> Agent[None, str]:
    model = FunctionModel(_one_tool_call_per_turn, stream_function=_streamed)
    agent = Agent(model, capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def note(text: str) -> str:
        return text.upper()

    return agent


async def chat_turns(
    agent: Agent[None, str], turns: int, history: list[ModelMessage] | None = None
) -> list[ModelMessage]:
    """Run `turns` turns, each a new run given the previous run's `all_messages()`; the last history."""
    messages = [] if history is None else history
    for turn in range(turns):
        messages = (await agent.run(f'question {turn}', message_history=messages)).all_messages()
    return messages
