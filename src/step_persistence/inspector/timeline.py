"""A run's timeline: its events grouped into spans (a model request, a tool call) in the order they began.

The event log says when each model request and tool call started and ended; the event ending a
model request also names the model that answered and its tokens (`StepEvent.model_name`,
`usage`). The newest snapshot's messages (of any state) say what the tool calls were: a call's
arguments and result are its `tool-call` and `tool-return` parts, found by `tool_call_id`; its
ledger status is its `ToolEffectRecord`. Events written before they carried the model and tokens
get them from the history: the run's completed requests are paired, in order, with the history's
last responses (a continued run's history starts with its origin's); when the history holds fewer
responses than that (a history processor dropped some), none is paired. A `run_failed` entry links
to the entry where the failure happened: the last failed request or call before it, else the last
entry of its step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from step_persistence.inspector.messages import MessageView
from step_persistence.records import StepEvent, ToolEffectRecord

__all__ = ['Timeline', 'TimelineEntry', 'build_timeline']

RESULT_CHARS = 240
"""A tool result is summarised on the timeline to this many characters (the messages page shows it whole)."""


@dataclass
class TimelineEntry:
    """One span (or a lone event) of the timeline."""

    anchor: str
    """The HTML id of the entry: `event-N`, N its first event's position in the log."""
    first_event: int
    kind: str
    """`run`, `model` or `tool`."""
    title: str
    step: int
    started_at: datetime
    events: list[str] = field(default_factory=list[str])
    """The kinds of its events, in order."""
    ended_at: datetime | None = None
    outcome: str = 'in flight'
    """`completed`, `failed`, `in flight` (no end event), or the run event's own name."""
    error: str | None = None
    model_name: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    arguments: str | None = None
    result: str | None = None
    ledger_status: str | None = None
    failed_at: str | None = None
    """For a `run_failed` entry: the anchor of the entry where the failure happened."""

    @property
    def duration_seconds(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class Timeline:
    entries: list[TimelineEntry]
    input_tokens: int
    output_tokens: int
    """Token totals of the requests paired with a response."""


def _summary(text: str) -> str:
    return text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS] + '...'


def build_timeline(
    events: Sequence[StepEvent], effects: Sequence[ToolEffectRecord], messages: Sequence[MessageView]
) -> Timeline:
    """The timeline of a run from its events (append order), its ledger and its newest history's views."""
    ledger = {effect.tool_call_id: effect.status for effect in effects}
    calls = {part.tool_call_id: part for m in messages for part in m.parts if part.kind == 'tool-call'}
    returns = {
        part.tool_call_id: part
        for m in messages
        for part in m.parts
        if part.kind in ('tool-return', 'retry-prompt', 'builtin-tool-return')
    }
    entries: list[TimelineEntry] = []
    open_requests: list[TimelineEntry] = []
    open_calls: dict[str, TimelineEntry] = {}

    def begin(index: int, event: StepEvent, kind: str, title: str) -> TimelineEntry:
        entry = TimelineEntry(
            anchor=f'event-{index}',
            first_event=index,
            kind=kind,
            title=title,
            step=event.step_index,
            started_at=event.timestamp,
            events=[event.kind],
        )
        entries.append(entry)
        return entry

    def end(entry: TimelineEntry, event: StepEvent, outcome: str) -> None:
        entry.events.append(event.kind)
        entry.ended_at = event.timestamp
        entry.outcome = outcome
        entry.error = event.error
        entry.model_name = event.model_name
        if event.usage is not None:
            entry.input_tokens, entry.output_tokens = event.usage.input_tokens, event.usage.output_tokens

    for index, event in enumerate(events):
        kind = event.kind
        if kind == 'model_request_started':
            open_requests.append(begin(index, event, 'model', 'model request'))
        elif kind in ('model_request_completed', 'model_request_failed'):
            outcome = 'completed' if kind == 'model_request_completed' else 'failed'
            entry = open_requests.pop(0) if open_requests else begin(index, event, 'model', 'model request')
            end(entry, event, outcome)
        elif kind == 'tool_call_started':
            entry = begin(index, event, 'tool', f'tool call {event.tool_name or ""}'.strip())
            entry.tool_name, entry.tool_call_id = event.tool_name, event.tool_call_id
            if event.tool_call_id is not None:
                open_calls[event.tool_call_id] = entry
        elif kind in ('tool_call_completed', 'tool_call_failed'):
            outcome = 'completed' if kind == 'tool_call_completed' else 'failed'
            found = open_calls.pop(event.tool_call_id or '', None)
            if found is None:
                found = begin(index, event, 'tool', f'tool call {event.tool_name or ""}'.strip())
                found.tool_name, found.tool_call_id = event.tool_name, event.tool_call_id
            end(found, event, outcome)
        else:
            entry = begin(index, event, 'run', kind.replace('_', ' '))
            entry.outcome, entry.error, entry.ended_at = kind.removeprefix('run_'), event.error, event.timestamp
            if kind == 'run_failed':
                entry.failed_at = _failure_site(entries[:-1], event.step_index)
    for entry in entries:
        if entry.tool_call_id is None:
            continue
        call, returned = calls.get(entry.tool_call_id), returns.get(entry.tool_call_id)
        entry.arguments = None if call is None else call.text
        entry.result = None if returned is None else _summary(returned.text or _media_summary(returned.media))
        entry.ledger_status = ledger.get(entry.tool_call_id)
    input_tokens, output_tokens = _pair_responses(entries, messages)
    return Timeline(entries=entries, input_tokens=input_tokens, output_tokens=output_tokens)


def _media_summary(media: Sequence[object]) -> str:
    return f'{len(media)} media item(s)' if media else ''


def _failure_site(before: Sequence[TimelineEntry], step: int) -> str | None:
    """The anchor of the last failed entry, else of the last entry of `step`."""
    failed = [entry for entry in before if entry.outcome == 'failed']
    if failed:
        return failed[-1].anchor
    same_step = [entry for entry in before if entry.step == step]
    return same_step[-1].anchor if same_step else None


def _pair_responses(entries: Sequence[TimelineEntry], messages: Sequence[MessageView]) -> tuple[int, int]:
    """Give completed model requests whose event has no tokens those of their response; return the token totals."""
    requests = [entry for entry in entries if entry.kind == 'model']
    completed = [entry for entry in requests if entry.outcome == 'completed']
    responses = [message for message in messages if message.kind == 'response']
    if any(entry.input_tokens is None for entry in completed) and len(responses) >= len(completed):
        for entry, response in zip(completed, responses[len(responses) - len(completed) :], strict=True):
            if entry.input_tokens is None:
                entry.model_name = entry.model_name or response.model_name
                entry.input_tokens, entry.output_tokens = response.input_tokens, response.output_tokens
    return (
        sum(entry.input_tokens or 0 for entry in requests),
        sum(entry.output_tokens or 0 for entry in requests),
    )
