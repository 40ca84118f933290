"""How messages are spelled in `messages.jsonl`: each version of each history position, once.

A line is `{"no": <n>, "pos": <i>, "digest": "<sha256 of the message JSON>", "message": <JSON>}`:
message number `n` (the line's rank in the file) holds a version of the message at position `i`
of the run's history. Saving a snapshot writes a line only for the positions whose message differs
from the latest stored version (usually the few new messages of the step, plus the previous newest
message, which pydantic-ai completes after it is first seen). A snapshot then refers to its history
in constant space (see `HistoryRef`).

This module is the one place where media externalization plugs in: `message_line` will move large
payloads to the media store (leaving markers) and `message_tree` will restore them. Until then
every message is stored inline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from step_persistence._history import EncodedMessage
from step_persistence.stores.file._codec import json_object, natural_number

__all__ = ['MessageEntry', 'load_message_entry', 'message_line', 'message_tree']


@dataclass(frozen=True)
class MessageEntry:
    """What the store indexes of a `messages.jsonl` line."""

    number: int
    position: int
    digest: str


def message_line(number: int, position: int, message: EncodedMessage) -> bytes:
    """The `messages.jsonl` line storing `message` as number `number`, at history position `position`."""
    return b'{"no":%d,"pos":%d,"digest":"%s","message":%s}' % (
        number,
        position,
        message.digest.encode('ascii'),
        message.data,
    )


def load_message_entry(line: bytes) -> MessageEntry:
    """The number, position and digest of a `messages.jsonl` line; raises `ValueError` for a malformed one."""
    value = json_object(line, 'messages.jsonl line')
    number = natural_number(value.get('no'), 'message number')
    position = natural_number(value.get('pos'), f'position of message {number}')
    digest = value.get('digest')
    if not isinstance(digest, str) or 'message' not in value:
        raise ValueError(f'malformed messages.jsonl line {number!r}: no digest or no message')
    return MessageEntry(number=number, position=position, digest=digest)


def message_tree(number: int, line: bytes) -> Any:
    """The JSON tree of message `number` from its `messages.jsonl` line."""
    value = json_object(line, 'messages.jsonl line')
    if value.get('no') != number:
        raise ValueError(f'expected message number {number}, found {value.get("no")!r}')
    return value['message']
