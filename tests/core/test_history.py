"""Message histories: which tool calls a history leaves unanswered, and the bytes a message is encoded to."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import TypeAdapter
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    UserPromptPart,
)

from step_persistence import is_provider_valid
from step_persistence._history import encode_message
from step_persistence.helpers import snapshot_state
from step_persistence.testing.conformance.shared import sample_history

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


def test_a_message_encodes_to_the_bytes_of_the_message_union() -> None:
    """Each message class's own serializer writes what the `ModelMessage` union's writes: digests stay the same."""
    history: list[ModelMessage] = [
        *sample_history(3, tag='union'),
        ModelResponse(parts=[ThinkingPart(content='hm'), TextPart(content='done')], state='interrupted'),
        ModelRequest(
            parts=[RetryPromptPart(content='bad', tool_name='lookup', tool_call_id='c1')], instructions='be brief'
        ),
    ]
    union = TypeAdapter(ModelMessage)
    for message in history:
        encoded = encode_message(message)
        assert encoded.data == union.dump_json(message)
        assert encoded.digest == hashlib.sha256(union.dump_json(message)).hexdigest()
