"""A `messages.jsonl` indexed by history position: the one place a save plan becomes lines.

Each history position has the versions stored for it in the file, in number order, with their
spans. A save appends only the positions whose message differs from the view it builds on
(numbered by `plan_saves`, see `step_persistence.stores._positions`), in one write; reading a view
picks, per position, the newest version numbered at most the view's `through`.

A history line's file is written this way; so was each run's own `messages.jsonl` before lines
(read, and compacted, but never appended to any more).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from step_persistence._history import EncodedMessage
from step_persistence.stores._media import PackedMessage
from step_persistence.stores._positions import NumberedRow, RunHead, plan_saves
from step_persistence.stores.file._codec import LegacyHistory
from step_persistence.stores.file._io import FileIo, Span
from step_persistence.stores.file._journal import Journal
from step_persistence.stores.file._messages import DamagedMessage, load_message_row, message_line

__all__ = ['MessageJournal', 'MessageVersion', 'history_checksum']

_SHORTEST_LINE = 100
"""Fewer bytes than any line of `messages.jsonl` takes (its digest alone is 64)."""
_MODULUS = 1 << 256


def history_checksum(digests: Iterable[str]) -> str:
    """The checksum of a history in a run's own `messages.jsonl` (before lines): the sum of
    SHA-256(`position:digest`) over its messages, mod 2**256."""
    total = sum(
        int.from_bytes(hashlib.sha256(f'{position}:{digest}'.encode('ascii')).digest(), 'big')
        for position, digest in enumerate(digests)
    )
    return f'{total % _MODULUS:064x}'


@dataclass(frozen=True)
class MessageVersion:
    """One stored version of the message at some history position."""

    number: int
    digest: str
    span: Span


class MessageJournal(Journal[NumberedRow]):
    """A `messages.jsonl`, indexed by history position: every stored version, in number order.

    `base_length` is the length of the line's base: positions below it may have no row of their
    own, so a row numbered `n` holds a position below `base_length + n`.
    """

    def __init__(self, path: Path, *, base_length: int = 0) -> None:
        self.base_length = base_length
        super().__init__(path)

    def clear(self) -> None:
        self.versions: list[list[MessageVersion]] = []
        """Per history position, the versions stored for it, oldest first."""
        self.last_no = 0
        """The number of the newest row (0: none)."""

    def parse(self, line: bytes) -> NumberedRow:
        """The row of a line read from the file; `ValueError` (the line is skipped) for one the file cannot hold.

        Lines are numbered in increasing order, and a line numbered `n` holds a position below
        `base_length + n`: every position the line holds beyond its base was stored in a row of its
        own with a lower number. Numbers are not bounded by the file (compaction drops lines and
        keeps the numbers), but each of those positions keeps a line of its own, so a position is
        also below `base_length` plus the number of lines the file has room for. Trusting a line
        that claims more would make every read allocate lists as long as the claimed position. A row
        whose message does not match its digest is skipped too, but keeps its number taken.
        """
        try:
            row = load_message_row(line)
        except DamagedMessage as error:
            if error.number > self.last_no:
                self.last_no = error.number  # its number stays taken, though the row is never used
            raise
        if row.no <= self.last_no:
            raise ValueError(f'message number {row.no} follows message {self.last_no}: numbers only increase')
        if row.position >= self.base_length + min(row.no, self.size // _SHORTEST_LINE):
            raise ValueError(f'message {row.no} claims history position {row.position}, more than the line can hold')
        return row

    def apply(self, entry: NumberedRow, span: Span) -> None:
        while len(self.versions) <= entry.position:
            self.versions.append([])
        self.versions[entry.position].append(MessageVersion(entry.no, entry.digest, span))
        self.last_no = entry.no

    def store(
        self,
        io: FileIo,
        head: RunHead,
        messages: Sequence[EncodedMessage],
        pack: Callable[[EncodedMessage], PackedMessage],
    ) -> int:
        """Append (in one write) the messages that differ from `head`'s view; their `through_message`.

        `head` is a view of this file's line whose `last_no` is this file's newest row. Each
        appended message is first `pack`ed (large payloads moved to the media store). The journal
        must be caught up, under the line's exclusive lock.
        """
        if head.last_no != self.last_no:
            raise ValueError(f'a save on row {head.last_no} of a line whose newest row is {self.last_no}')
        plan = plan_saves(head, [[message.digest for message in messages]])
        self.append(io, [(message_line(row, pack(messages[row.position])), row) for row in plan.rows])
        return plan.throughs[0]

    def version_at(self, position: int, through: int) -> MessageVersion | None:
        """The newest stored version at `position` numbered at most `through`, if any."""
        stored = self.versions[position] if position < len(self.versions) else []
        index = bisect_right(stored, through, key=lambda version: version.number)
        return stored[index - 1] if index else None

    def resolve(self, history: LegacyHistory) -> list[MessageVersion]:
        """The versions that make up a snapshot written before lines; `ValueError` if they are missing or
        do not match it."""
        chosen: list[MessageVersion] = []
        for position in range(history.length):
            version = self.version_at(position, history.through_message)
            if version is None:
                raise ValueError(f'no stored message at position {position} up to number {history.through_message}')
            chosen.append(version)
        if history_checksum(version.digest for version in chosen) != history.checksum:
            raise ValueError('the stored messages do not match the snapshot (a damaged or missing messages.jsonl line)')
        return chosen
