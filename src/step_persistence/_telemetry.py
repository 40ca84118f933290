"""The record's identity as attributes on the OpenTelemetry spans pydantic-ai's instrumentation opens.

pydantic-ai's `Instrumentation` capability runs outermost, so while `StepPersistence`'s hooks run,
the current span is pydantic-ai's own: the agent run span in `wrap_run`, `before_run` and
`after_run`, the `chat` span in `wrap_model_request`, the `execute_tool` span in
`wrap_tool_execute`. `RunSpans` sets attributes on those spans and opens none. An uninstrumented
run (its `RunContext.tracer` is the no-op tracer) is left alone even when an application's span is
current, and so is a span that is not recording (sampled out). The names are stable: they are listed
in docs/observability.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import NoOpTracer, Span, get_current_span
from pydantic_ai.tools import RunContext

from step_persistence._reading import logger
from step_persistence._urls import redact_text
from step_persistence.protocol import StepStore
from step_persistence.records import ContinuableSnapshot, RunOrigin, ToolEffectRecord

__all__ = [
    'CONVERSATION_ID',
    'ORIGIN_KIND',
    'ORIGIN_RUN_ID',
    'ORIGIN_SEQ',
    'PARENT_RUN_ID',
    'RUN_ID',
    'SNAPSHOT_SEQ',
    'SNAPSHOT_STATE',
    'STEP_INDEX',
    'TOOL_EFFECT_IDEMPOTENCY_KEY',
    'TOOL_EFFECT_STATUS',
    'RunSpans',
]

RUN_ID = 'step_persistence.run_id'
CONVERSATION_ID = 'step_persistence.conversation_id'
PARENT_RUN_ID = 'step_persistence.parent_run_id'
ORIGIN_KIND = 'step_persistence.origin.kind'
ORIGIN_RUN_ID = 'step_persistence.origin.run_id'
ORIGIN_SEQ = 'step_persistence.origin.seq'
STEP_INDEX = 'step_persistence.step_index'
SNAPSHOT_SEQ = 'step_persistence.snapshot.seq'
SNAPSHOT_STATE = 'step_persistence.snapshot.state'
TOOL_EFFECT_STATUS = 'step_persistence.tool_effect.status'
TOOL_EFFECT_IDEMPOTENCY_KEY = 'step_persistence.tool_effect.idempotency_key'


@dataclass(slots=True)
class RunSpans:
    """One run's attributes on pydantic-ai's spans; until `start` finds a recording run span, its methods do nothing."""

    run_id: str
    run_span: Span | None = None
    """pydantic-ai's span of the run (`None`: the run is not traced, and nothing is set)."""
    tool_spans: dict[str, Span] = field(default_factory=dict[str, Span])
    """The spans of the tool calls in flight, by `tool_call_id`."""

    @property
    def traced(self) -> bool:
        return self.run_span is not None

    def start(self, ctx: RunContext[Any], *, conversation_id: str | None, parent_run_id: str | None) -> None:
        """From `wrap_run`: take the current span as the run's, if pydantic-ai instruments this run and it records."""
        if isinstance(ctx.tracer, NoOpTracer) or ctx.realtime:
            return  # not instrumented (a current span is the application's), or a realtime session's own spans
        span = get_current_span()
        if not span.is_recording():
            return
        self.run_span = span
        span.set_attribute(RUN_ID, self.run_id)
        if conversation_id is not None:
            span.set_attribute(CONVERSATION_ID, conversation_id)
        if parent_run_id is not None:
            span.set_attribute(PARENT_RUN_ID, parent_run_id)

    def registered(self, origin: RunOrigin | None) -> None:
        """The stored snapshot the run continued or forked from, on the run's span."""
        if self.run_span is None or origin is None:
            return
        self.run_span.set_attributes({ORIGIN_KIND: origin.kind, ORIGIN_RUN_ID: origin.run_id, ORIGIN_SEQ: origin.seq})

    def model_request(self, step_index: int) -> None:
        """From `wrap_model_request`: the run and step on the request's `chat` span."""
        if self.run_span is not None:
            get_current_span().set_attributes({RUN_ID: self.run_id, STEP_INDEX: step_index})

    def tool_started(self, record: ToolEffectRecord, *, step_index: int) -> None:
        """From `wrap_tool_execute`: the run, step and `started` status on the call's `execute_tool` span."""
        if self.run_span is None:
            return
        span = get_current_span()
        self.tool_spans[record.tool_call_id] = span
        span.set_attributes({RUN_ID: self.run_id, STEP_INDEX: step_index, TOOL_EFFECT_STATUS: record.status})

    def tool_settled(self, record: ToolEffectRecord) -> None:
        """The status the call ended with, and its idempotency key if the tool gave one, on its span (if still open)."""
        span = self.tool_spans.pop(record.tool_call_id, None)
        if span is None or not span.is_recording():
            return
        span.set_attribute(TOOL_EFFECT_STATUS, record.status)
        if record.idempotency_key is not None:
            span.set_attribute(TOOL_EFFECT_IDEMPOTENCY_KEY, record.idempotency_key)

    async def snapshots_saved(self, store: StepStore, snapshots: Sequence[ContinuableSnapshot]) -> None:
        """The newest of `snapshots` (just written) on the current span: its state, and its `seq` read back.

        The protocol's `save_snapshot` does not return the `seq` it assigned, so it is looked up by the
        history's digest (`find_snapshot`, an indexed read), only for a traced run. A lookup that fails,
        or finds the history in another run of the conversation, leaves the `seq` out.
        """
        if self.run_span is None or not snapshots:
            return
        span = get_current_span()
        if not span.is_recording():
            return
        snapshot = snapshots[-1]
        span.set_attribute(SNAPSHOT_STATE, snapshot.state)
        find = getattr(store, 'find_snapshot', None)
        if snapshot.conversation_id is None or find is None:
            return
        try:
            found = await find(conversation_id=snapshot.conversation_id, history_digest=snapshot.history_digest())
        except Exception as error:
            logger.warning(
                "run %r: its snapshot's seq is left off the span, looking it up failed: %s",
                self.run_id,
                redact_text(repr(error)),
            )
            return
        if found is not None and found.run_id == self.run_id:
            span.set_attribute(SNAPSHOT_SEQ, found.seq)
