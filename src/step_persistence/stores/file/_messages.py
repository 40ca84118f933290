"""How messages are spelled in `messages.jsonl`: each distinct message of a run once, numbered.

A line is `{"no": <n>, "digest": "<sha256 of the message JSON>", "message": <the message JSON>}`.
Snapshots refer to messages by number, so saving a snapshot writes only the messages that are new.

This module is the one place where media externalization plugs in: `message_line` will move large
payloads to the media store (leaving markers) and `message_tree` will restore them. Until then
every message is stored inline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from step_persistence._history import EncodedMessage
from step_persistence.stores.file._codec import json_object

__all__ = ['MessageEntry', 'load_message_entry', 'message_line', 'message_tree']


@dataclass(frozen=True)
class MessageEntry:
    """What the store indexes of a `messages.jsonl` line."""

    number: int
    digest: str


def message_line(number: int, message: EncodedMessage) -> bytes:
    """The `messages.jsonl` line storing `message` as message number `number`."""
    return b'{"no":%d,"digest":"%s","message":%s}' % (number, message.digest.encode('ascii'), message.data)


def load_message_entry(line: bytes) -> MessageEntry:
    """The number and digest of a `messages.jsonl` line; raises `ValueError` for a malformed one."""
    value = json_object(line, 'messages.jsonl line')
    number, digest = value.get('no'), value.get('digest')
    if not isinstance(number, int) or isinstance(number, bool) or not isinstance(digest, str) or 'message' not in value:
        raise ValueError(f'malformed messages.jsonl line (no={number!r}, digest={digest!r})')
    return MessageEntry(number=number, digest=digest)


def message_tree(number: int, line: bytes) -> Any:
    """The JSON tree of message `number` from its `messages.jsonl` line."""
    value = json_object(line, 'messages.jsonl line')
    if value.get('no') != number:
        raise ValueError(f'expected message number {number}, found {value.get("no")!r}')
    return value['message']
