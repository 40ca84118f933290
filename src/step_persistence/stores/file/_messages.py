"""How messages are spelled in `messages.jsonl`: each version of each history position, once.

A line is `{"no": <n>, "pos": <i>, "digest": "<sha256>", "externalized": <bool>, "message": <JSON>}`:
message number `n` (the line's rank in the file) holds a version of the message at position `i`
of the run's history. Saving a snapshot writes a line only for the positions whose message differs
from the latest stored version (usually the few new messages of the step, plus the previous newest
message, which pydantic-ai completes after it is first seen). A snapshot then refers to its history
in constant space (see `HistoryRef`).

`digest` is the SHA-256 of the message's own JSON. `message` is that JSON, or, when
`externalized` is true, the JSON with its large payloads replaced by media markers (the payloads
are in the store's media store; see `step_persistence.stores._media`); such a line also carries
`"stored_digest"`, the SHA-256 of its `message` bytes as written (markers included).

Indexing a line and reading a message both hash its bytes as written (`message` is the line's last
field, so they are found without re-encoding anything) against `digest` (inline) or
`stored_digest` (externalized; each payload is then checked against its content address by the
media store): a message altered on disk, even by one character of the same width, is refused with
`DamagedMessage`, never returned, and never reused by a later save.
"""

from __future__ import annotations

import hashlib
from typing import Any

from step_persistence.stores._media import PackedMessage
from step_persistence.stores._positions import NumberedRow
from step_persistence.stores.file._codec import json_object, natural_number

__all__ = ['DamagedMessage', 'load_message_row', 'message_line', 'stored_message']


def message_line(row: NumberedRow, message: PackedMessage) -> bytes:
    """The `messages.jsonl` line storing `message` (whose digest is `row.digest`) as number `row.no`, at
    history position `row.position`."""
    if not message.externalized:
        return b'{"no":%d,"pos":%d,"digest":"%s","externalized":false,%s%s}' % (
            row.no,
            row.position,
            row.digest.encode('ascii'),
            _MESSAGE_FIELD,
            message.data,
        )
    return b'{"no":%d,"pos":%d,"digest":"%s","externalized":true,"stored_digest":"%s",%s%s}' % (
        row.no,
        row.position,
        row.digest.encode('ascii'),
        hashlib.sha256(message.data).hexdigest().encode('ascii'),
        _MESSAGE_FIELD,
        message.data,
    )


_MESSAGE_FIELD = b'"message":'
"""The last field of a line; no field before it can hold these bytes (numbers, a hex digest, a boolean)."""


class DamagedMessage(ValueError):
    """A message line whose bytes do not match its digest: damaged or edited after it was written."""

    def __init__(self, message: str, *, number: int) -> None:
        super().__init__(message)
        self.number = number
        """The row's number: it is still taken (a later row must not be given it)."""


def _checked(value: dict[str, Any], line: bytes, number: int, digest: str) -> tuple[Any, bool]:
    """The message tree and `externalized` flag of a parsed line, after checking its bytes as written."""
    externalized = value.get('externalized')
    if not isinstance(externalized, bool) or 'message' not in value:
        raise ValueError(f'malformed messages.jsonl line {number}: no externalized flag or no message')
    expected = value.get('stored_digest') if externalized else digest
    start = line.find(_MESSAGE_FIELD)
    written = line[start + len(_MESSAGE_FIELD) : -1] if start > 0 and line.endswith(b'}') else b''
    if not isinstance(expected, str) or hashlib.sha256(written).hexdigest() != expected:
        raise DamagedMessage(
            f'message {number} does not match its digest (a damaged or edited messages.jsonl line); '
            'the snapshots that use it are unreadable',
            number=number,
        )
    return value['message'], externalized


def load_message_row(line: bytes) -> NumberedRow:
    """The number, position and digest of a `messages.jsonl` line; raises `ValueError` for a malformed one
    and `DamagedMessage` for one whose message does not match its digest (it is then never indexed, so
    the next save writes that position again instead of reusing the damaged line)."""
    value = json_object(line, 'messages.jsonl line')
    number = natural_number(value.get('no'), 'message number')
    position = natural_number(value.get('pos'), f'position of message {number}')
    digest = value.get('digest')
    if not isinstance(digest, str):
        raise ValueError(f'malformed messages.jsonl line {number!r}: no digest')
    _checked(value, line, number, digest)
    return NumberedRow(no=number, position=position, digest=digest)


def stored_message(number: int, digest: str, line: bytes) -> tuple[Any, bool]:
    """The stored JSON tree of message `number` (of digest `digest`) from its `messages.jsonl` line, and
    its `externalized` flag; `ValueError` if the line is malformed, `DamagedMessage` if its bytes no
    longer match (checked again at each read: the line may have changed since it was indexed)."""
    value = json_object(line, 'messages.jsonl line')
    if value.get('no') != number:
        raise ValueError(f'expected message number {number}, found {value.get("no")!r}')
    return _checked(value, line, number, digest)
