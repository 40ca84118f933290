"""`messages.jsonl`, indexed by history position, and the references snapshots make into it.

Each position of the run's history has the versions stored for it, in number order. Saving a
snapshot appends only the positions whose message differs from the latest stored version
(numbered by `plan_saves`, see `step_persistence.stores._positions`), and returns a `HistoryRef`
of constant size. Finding those positions compares digests, and the
reference's checksum is kept up to date as versions are applied, so a save costs a few list
operations per message of the history and no hashing of the whole history.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from step_persistence._history import EncodedMessage
from step_persistence.stores._media import PackedMessage
from step_persistence.stores._positions import NumberedRow, RunHead, plan_saves, plausible_position
from step_persistence.stores.file._codec import HistoryRef
from step_persistence.stores.file._io import FileIo, Span
from step_persistence.stores.file._journal import Journal
from step_persistence.stores.file._messages import load_message_row, message_line

__all__ = ['MessageJournal', 'MessageVersion', 'history_checksum']

_SHORTEST_LINE = 100
"""Fewer bytes than any line of `messages.jsonl` takes (its digest alone is 64)."""
_MODULUS = 1 << 256
_DIGEST = attrgetter('digest')


def _term(position: int, digest: str) -> int:
    return int.from_bytes(hashlib.sha256(f'{position}:{digest}'.encode('ascii')).digest(), 'big')


def _hex(total: int) -> str:
    return f'{total % _MODULUS:064x}'


def history_checksum(digests: Iterable[str]) -> str:
    """The checksum of a history: the sum of SHA-256(`position:digest`) over its messages, mod 2**256.

    A sum rather than a chain, so that it can be updated one position at a time. It detects
    damaged or missing lines, not deliberate tampering.
    """
    return _hex(sum(_term(position, digest) for position, digest in enumerate(digests)))


@dataclass(frozen=True)
class MessageVersion:
    """One stored version of the message at some history position."""

    number: int
    digest: str
    span: Span


class MessageJournal(Journal[NumberedRow]):
    """`messages.jsonl`, indexed by history position: every stored version, in number order."""

    def clear(self) -> None:
        self.versions: list[list[MessageVersion]] = []
        """Per history position, the versions stored for it, oldest first."""
        self.latest: list[str | None] = []
        """Per history position, the digest of its latest version (`None` if it has none)."""
        self._latest_total = 0
        """The sum of the checksum terms of the latest versions."""
        self.next_number = 1

    def parse(self, line: bytes) -> NumberedRow:
        """The row of a line read from the file; `ValueError` (the line is skipped) for one the run cannot hold.

        Lines are numbered in increasing order, and a line numbered `n` holds a position below `n`
        (`plausible_position`). Numbers are not bounded by the file (collection drops lines and
        keeps the numbers), but every position below the largest one keeps a line of its own, so
        a position is also below the number of lines the file has room for. Trusting a line that
        claims more would make every read allocate lists as long as the claimed position.
        """
        row = load_message_row(line)
        if row.no < self.next_number:
            raise ValueError(f'message number {row.no} follows message {self.next_number - 1}: numbers only increase')
        if not plausible_position(row.no, row.position) or row.position >= self.size // _SHORTEST_LINE:
            raise ValueError(f'message {row.no} claims history position {row.position}, more than the run can hold')
        return row

    def apply(self, entry: NumberedRow, span: Span) -> None:
        position = entry.position
        while len(self.versions) <= position:
            self.versions.append([])
            self.latest.append(None)
        previous = self.latest[position]
        if previous is not None:
            self._latest_total -= _term(position, previous)
        self.latest[position] = entry.digest
        self._latest_total += _term(position, entry.digest)
        self.versions[position].append(MessageVersion(entry.no, entry.digest, span))
        self.next_number = max(self.next_number, entry.no + 1)

    def store(
        self, io: FileIo, messages: Sequence[EncodedMessage], pack: Callable[[EncodedMessage], PackedMessage]
    ) -> HistoryRef:
        """Append (in one write) the messages that differ from the latest stored version at their position.

        Each appended message is first `pack`ed (large payloads moved to the media store). Returns
        the reference to `messages` as now stored; the journal must be caught up, under the run's
        exclusive lock.
        """
        digests = list(map(_DIGEST, messages))
        # No incarnation: `RunIndex.adopt` already starts the journal over for a run registered again.
        head = RunHead(incarnation=None, last_no=self.next_number - 1, latest=self.latest)
        plan = plan_saves(head, [digests])
        self.append(io, [(message_line(row, pack(messages[row.position])), row) for row in plan.rows])
        beyond = sum(
            _term(position, digest)
            for position, digest in enumerate(self.latest[len(digests) :], start=len(digests))
            if digest is not None
        )
        return HistoryRef(
            length=len(digests), through_message=plan.throughs[0], checksum=_hex(self._latest_total - beyond)
        )

    def version_at(self, position: int, through_message: int) -> MessageVersion | None:
        """The newest stored version at `position` numbered at most `through_message`, if any."""
        stored = self.versions[position] if position < len(self.versions) else []
        index = bisect_right(stored, through_message, key=lambda version: version.number)
        return stored[index - 1] if index else None

    def resolve(self, history: HistoryRef) -> list[MessageVersion]:
        """The stored versions that make up `history`; `ValueError` if they are missing or do not match it."""
        chosen: list[MessageVersion] = []
        for position in range(history.length):
            version = self.version_at(position, history.through_message)
            if version is None:
                raise ValueError(f'no stored message at position {position} up to number {history.through_message}')
            chosen.append(version)
        if history_checksum(version.digest for version in chosen) != history.checksum:
            raise ValueError('the stored messages do not match the snapshot (a damaged or missing messages.jsonl line)')
        return chosen
