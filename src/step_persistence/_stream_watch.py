"""`StreamWatch`: a model wrapper that hands every response stream it opens to a callback.

A capability's hooks see a streamed response only once pydantic-ai hands it back, which
`run_stream` does after running the function tools of its final response; by then the stream
itself (`StreamedResponse.get()`) already holds the whole response, but only the model that opened
it can reach it. Wrapping the model (`AbstractCapability.get_wrapper_model`) gives that reach.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

__all__ = ['StreamWatch']


class StreamWatch(WrapperModel):
    """`wrapped`, calling `on_stream` with each stream it opens, before anyone reads from it."""

    def __init__(self, wrapped: Model, on_stream: Callable[[StreamedResponse], None]) -> None:
        super().__init__(wrapped)
        self._on_stream = on_stream

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse]:
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as stream:
            self._on_stream(stream)
            yield stream
