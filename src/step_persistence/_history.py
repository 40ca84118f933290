"""Per-message encoding of a message history, done once per message object.

A run's history grows by a few messages per step, and every settled step is
snapshotted. Encoding the whole history at every step would make a long run
quadratic, so each message is encoded once, the first time it is seen, and its
encoding is reused by every later snapshot that contains the same object.
Stores use the digest to write each distinct message of a run once.

pydantic-ai is imported by the first function that encodes, decodes or inspects a message, not by
importing this module (digests and `EncodedMessage` need none of it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from step_persistence._lru import BoundedLru

if TYPE_CHECKING:
    import pydantic
    from pydantic_ai.messages import ModelMessage

__all__ = [
    'EncodedHistory',
    'EncodedMessage',
    'HistoryEncoder',
    'answered_call_ids',
    'decode_messages',
    'encode_message',
    'encode_messages',
    'history_digest',
    'tool_call_ids',
]


@functools.cache
def _message_adapter() -> pydantic.TypeAdapter[ModelMessage]:
    """The adapter of one message, built on first use."""
    import pydantic
    from pydantic_ai.messages import ModelMessage

    return pydantic.TypeAdapter(ModelMessage)


@functools.cache
def _serializers_by_class() -> dict[type[Any], Callable[[Any], bytes]]:
    """`dump_json` of a message, by its exact class: each member of the `ModelMessage` union's own adapter.

    It writes the bytes the union's adapter writes for that class, without the union's serializer
    trying its members in turn (a response's encoding takes about half the time).
    """
    import pydantic
    from pydantic_ai.messages import ModelRequest, ModelResponse

    return {cls: pydantic.TypeAdapter(cls).dump_json for cls in (ModelRequest, ModelResponse)}


@dataclass(frozen=True, slots=True)
class EncodedMessage:
    """One message as JSON, with the SHA-256 digest of those bytes (its identity within a run)."""

    digest: str
    data: bytes

    def tree(self) -> Any:
        """A fresh JSON tree (dicts, lists, scalars) of the message."""
        return json.loads(self.data)


def encode_message(message: ModelMessage) -> EncodedMessage:
    """Encode one message (this copies it: later mutation of `message` does not change the result)."""
    dump_json = _serializers_by_class().get(type(message))
    data = _message_adapter().dump_json(message) if dump_json is None else dump_json(message)
    return EncodedMessage(digest=hashlib.sha256(data).hexdigest(), data=data)


def encode_messages(messages: Iterable[ModelMessage]) -> tuple[EncodedMessage, ...]:
    """Encode every message of a history."""
    return tuple(encode_message(message) for message in messages)


def history_digest(digests: Iterable[str]) -> str:
    """SHA-256 (hex) of a history's message digests in order: equal histories, equal digests.

    The digest of the empty history is that of no bytes.
    """
    return hashlib.sha256(''.join(digests).encode('ascii')).hexdigest()


def decode_messages(trees: Sequence[Any]) -> list[ModelMessage]:
    """Validate JSON trees back into messages; raises `ValueError` on anything malformed."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter.validate_python(list(trees))


def tool_call_ids(message: ModelMessage) -> list[str]:
    """Ids of the function tool calls a response makes (none for a request)."""
    from pydantic_ai.messages import ModelResponse, ToolCallPart

    if not isinstance(message, ModelResponse):
        return []
    return [part.tool_call_id for part in message.parts if isinstance(part, ToolCallPart)]


def answered_call_ids(message: ModelMessage) -> list[str]:
    """Ids of the tool calls a request answers, with a return or a retry prompt (none for a response).

    A retry prompt without a tool name asks the model to redo its output, not a tool call: it answers none.
    """
    from pydantic_ai.messages import ModelRequest, RetryPromptPart, ToolReturnPart

    if not isinstance(message, ModelRequest):
        return []
    return [
        part.tool_call_id
        for part in message.parts
        if isinstance(part, ToolReturnPart) or (isinstance(part, RetryPromptPart) and part.tool_name is not None)
    ]


def _follow(pending: dict[str, None], message: ModelMessage) -> None:
    """Update the ordered set of unanswered tool call ids with one more message."""
    pending.update(dict.fromkeys(tool_call_ids(message)))
    for call_id in answered_call_ids(message):
        pending.pop(call_id, None)


@dataclass(frozen=True, slots=True)
class EncodedHistory:
    """A history as per-message JSON, with the tool calls it leaves unanswered."""

    messages: tuple[EncodedMessage, ...]
    unanswered: tuple[str, ...]
    """Ids of tool calls without a result, in call order."""


class HistoryEncoder:
    """Encodes successive histories of one run, paying only for the messages each one adds.

    Treats a message object as immutable once another message follows it, which is how
    pydantic-ai builds histories: it appends new messages and replaces (never edits) old ones.
    The newest message of a history may still be completed in place, so it is encoded afresh
    each time it is the newest. A history that is not an extension of the previous one (a
    rewritten history) is re-read, reusing the encoding of every message object seen before.

    `shared`: encodings of settled messages kept across encoders (runs), so a run given the
    previous run's history (a chat's next turn) encodes only the messages it adds.
    """

    def __init__(self, shared: BoundedLru[int, tuple[ModelMessage, EncodedMessage]] | None = None) -> None:
        self._shared = shared
        self._by_identity: dict[int, tuple[ModelMessage, EncodedMessage]] = {}
        self._prefix: list[ModelMessage] = []
        self._prefix_encoded: tuple[EncodedMessage, ...] = ()
        self._prefix_pending: dict[str, None] = {}

    def _encode_settled(self, message: ModelMessage) -> EncodedMessage:
        key = id(message)
        known = self._by_identity.get(key)
        if known is None or known[0] is not message:
            known = None if self._shared is None else self._shared.get(key)
            if known is None or known[0] is not message:
                known = (message, encode_message(message))
                if self._shared is not None:
                    self._shared.put(key, known)
            self._by_identity[key] = known
        return known[1]

    def encode(self, messages: Sequence[ModelMessage]) -> EncodedHistory:
        """Encode `messages`; the cost follows the messages added since the previous call."""
        settled = len(messages) - 1
        known = len(self._prefix)
        if known > settled or not all(map(operator.is_, self._prefix, messages[:known])):
            self._prefix, self._prefix_encoded, self._prefix_pending = [], (), {}
            known = 0
        if settled > known:
            added = messages[known:settled]
            self._prefix_encoded += tuple(self._encode_settled(message) for message in added)
            for message in added:
                _follow(self._prefix_pending, message)
            self._prefix.extend(added)
        pending = dict(self._prefix_pending)
        newest = tuple(encode_message(message) for message in messages[settled:])
        for message in messages[settled:]:
            _follow(pending, message)
        return EncodedHistory(messages=self._prefix_encoded + newest, unanswered=tuple(pending))
