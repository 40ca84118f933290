"""Scripted models for agent tests: no network, deterministic, streaming and non-streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

Step = ModelResponse | Callable[[list[ModelMessage]], ModelResponse]


def calls(*tool_calls: tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], str]) -> ModelResponse:
    """A response calling the given tools; ids default to `<tool>-<position>`."""
    parts = [
        ToolCallPart(call[0], call[1], call[2] if len(call) == 3 else f'{call[0]}-{index}')
        for index, call in enumerate(tool_calls)
    ]
    return ModelResponse(parts=list(parts))


def text(content: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


def turn_step(messages: Sequence[ModelMessage]) -> int:
    """How many responses the model has given since the latest user prompt."""
    last_prompt = max(
        (
            index
            for index, message in enumerate(messages)
            if isinstance(message, ModelRequest) and any(isinstance(p, UserPromptPart) for p in message.parts)
        ),
        default=0,
    )
    return sum(isinstance(message, ModelResponse) for message in messages[last_prompt:])


def scripted(*steps: Step) -> FunctionModel:
    """A model that answers the n-th request of each turn with `steps[n]` (the last step repeats)."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = steps[min(turn_step(messages), len(steps) - 1)]
        return step(messages) if callable(step) else step

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        response = respond(messages, info)
        for index, part in enumerate(response.parts):
            if isinstance(part, TextPart):
                yield part.content
            elif isinstance(part, ToolCallPart):
                yield {
                    index: DeltaToolCall(
                        name=part.tool_name, json_args=part.args_as_json_str(), tool_call_id=part.tool_call_id
                    )
                }

    return FunctionModel(respond, stream_function=stream)
