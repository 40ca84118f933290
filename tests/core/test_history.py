"""Tool-call bookkeeping of message histories: which calls a history leaves unanswered."""

from __future__ import annotations

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, RetryPromptPart, TextPart, ToolCallPart, UserPromptPart

from step_persistence import is_provider_valid
from step_persistence.helpers import snapshot_state

# Stored histories hold the parts pydantic-ai wrote when they were recorded, deprecated ones included.
pytestmark = pytest.mark.filterwarnings('ignore:`RetryPromptPart` is deprecated')


def test_a_retry_of_the_output_is_not_an_orphan_tool_result() -> None:
    history = [
        ModelRequest(parts=[UserPromptPart(content='answer as JSON')]),
        ModelResponse(parts=[TextPart(content='not json')]),
        ModelRequest(parts=[RetryPromptPart(content='invalid JSON', tool_name=None)]),
        ModelResponse(parts=[TextPart(content='{"ok": true}')]),
    ]
    assert is_provider_valid(history)
    assert snapshot_state(history) == 'complete'


def test_a_retry_of_a_tool_answers_its_call_and_an_unmatched_one_is_an_orphan() -> None:
    call = ModelResponse(parts=[ToolCallPart('lookup', {'q': 1}, 'c1')])
    retried = ModelRequest(parts=[RetryPromptPart(content='bad args', tool_name='lookup', tool_call_id='c1')])
    orphan = ModelRequest(parts=[RetryPromptPart(content='bad args', tool_name='lookup', tool_call_id='c9')])
    assert is_provider_valid([call, retried])
    assert not is_provider_valid([call, retried, orphan])
    assert not is_provider_valid([call])
