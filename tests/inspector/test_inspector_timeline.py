"""The timeline's model names and tokens: from the events that ended the requests, else (records written
before events carried them) from the responses of the newest history, paired in order."""

from __future__ import annotations

from pydantic_ai.messages import ModelRequest, ModelResponse, RequestUsage, TextPart, UserPromptPart

from step_persistence.inspector.messages import message_views
from step_persistence.inspector.timeline import build_timeline
from step_persistence.records import StepEvent, TokenUsage

RUN = 'r'


def _request(step: int, *, model: str | None = None, tokens: tuple[int, int] | None = None) -> list[StepEvent]:
    usage = (
        None
        if tokens is None
        else TokenUsage(input_tokens=tokens[0], output_tokens=tokens[1], cache_read_tokens=0, cache_write_tokens=0)
    )
    return [
        StepEvent(run_id=RUN, kind='model_request_started', step_index=step),
        StepEvent(run_id=RUN, kind='model_request_completed', step_index=step, model_name=model, usage=usage),
    ]


def _history(*usages: tuple[str, int, int]) -> list[ModelRequest | ModelResponse]:
    messages: list[ModelRequest | ModelResponse] = [ModelRequest(parts=[UserPromptPart('origin prompt')])]
    for model, tokens_in, tokens_out in usages:
        messages.append(
            ModelResponse(
                parts=[TextPart('ok')],
                model_name=model,
                usage=RequestUsage(input_tokens=tokens_in, output_tokens=tokens_out),
            )
        )
    return messages


def test_the_events_model_and_tokens_are_shown() -> None:
    events = [*_request(1, model='gpt-a', tokens=(10, 2)), *_request(2, model='gpt-b', tokens=(20, 3))]
    history = message_views(_history(('other', 99, 99)))
    timeline = build_timeline(events, [], history)
    assert [(e.model_name, e.input_tokens, e.output_tokens) for e in timeline.entries] == [
        ('gpt-a', 10, 2),
        ('gpt-b', 20, 3),
    ]
    assert (timeline.input_tokens, timeline.output_tokens) == (30, 5)


def test_older_events_get_the_last_responses_of_the_history_in_order() -> None:
    events = [*_request(1), *_request(2)]
    history = message_views(_history(('origin-model', 1, 1), ('m1', 10, 2), ('m2', 20, 3)))
    timeline = build_timeline(events, [], history)
    assert [(e.model_name, e.input_tokens) for e in timeline.entries] == [('m1', 10), ('m2', 20)]
    assert (timeline.input_tokens, timeline.output_tokens) == (30, 5)


def test_a_history_with_fewer_responses_than_requests_gives_none() -> None:
    timeline = build_timeline([*_request(1), *_request(2)], [], message_views(_history(('m1', 10, 2))))
    assert [(e.model_name, e.input_tokens) for e in timeline.entries] == [(None, None), (None, None)]
    assert (timeline.input_tokens, timeline.output_tokens) == (0, 0)
