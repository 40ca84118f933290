"""Digests of a unit's inputs, stable across a replay: what the determinism guard compares."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

__all__ = ['MessageDigests', 'digest', 'inputs_fingerprint', 'tool_call_fingerprint']

_STAMP = 'timestamp'
"""The field pydantic-ai sets on every message and on a message's parts (a prompt's, a tool return's time):
a replay sets it afresh although its inputs are the same."""

_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def _without_stamp(item: Any) -> Any:
    return {key: value for key, value in item.items() if key != _STAMP} if isinstance(item, dict) else item


def _unstamped(messages: Sequence[ModelMessage]) -> list[Any]:
    """`messages` as JSON without the timestamps pydantic-ai stamps on each message and part: only there, so a
    `timestamp` in a tool's arguments, a tool's result or the application's content is compared like any key."""
    unstamped: list[Any] = []
    for message in ModelMessagesTypeAdapter.dump_python(list(messages), mode='json'):
        message = _without_stamp(message)
        parts = message.get('parts')
        if isinstance(parts, list):
            message['parts'] = [_without_stamp(part) for part in parts]
        unstamped.append(message)
    return unstamped


def digest(value: Any) -> str:
    """The SHA-256 (hex) of `value` as canonical JSON (sorted keys)."""
    encoded = json.dumps(value, sort_keys=True, separators=(',', ':'), ensure_ascii=False)
    return hashlib.sha256(encoded.encode()).hexdigest()


class MessageDigests:
    """The digests of one run's messages, each computed once: a run's requests send its history again and again.

    Kept by identity (with the message, so an id is never reused for another one): a history is a list of
    the same message objects from one request to the next, so each request digests only its new messages.
    """

    def __init__(self) -> None:
        self._known: dict[int, tuple[ModelMessage, str]] = {}

    def of(self, message: ModelMessage) -> str:
        known = self._known.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        computed = digest(_unstamped([message]))
        self._known[id(message)] = (message, computed)
        return computed

    def fingerprint(self, messages: Sequence[ModelMessage], *extra: Any) -> str:
        """A model request's inputs: the messages sent (without their timestamps) and `extra` (the model id)."""
        return digest(
            [[self.of(message) for message in messages], *(_ANY.dump_python(each, mode='json') for each in extra)]
        )


def tool_call_fingerprint(tool_name: str, arguments: Any) -> str:
    """A tool call's inputs: the tool's name and its validated arguments."""
    return digest([tool_name, _ANY.dump_python(arguments, mode='json')])


def inputs_fingerprint(prompt: Any, messages: Sequence[ModelMessage]) -> str:
    """A run's inputs: its prompt and its initial history (without timestamps)."""
    return digest([_ANY.dump_python(prompt, mode='json'), _unstamped(messages)])
