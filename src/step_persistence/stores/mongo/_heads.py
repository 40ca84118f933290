"""What a store knows of one run's stored messages: the newest digest at each history position.

Message documents are numbered 1, 2, 3, ... per run, and a number is claimed by inserting its
document (the unique `(run_id, no)` index), so the numbers in use always form one unbroken
sequence. A head knows every document up to `last_no`; no document numbered at or below it can
appear later, so a snapshot referring to the history "as of `last_no`" means exactly what the
head says, whatever other writers do next.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ['MessageRow', 'RunHead']

MessageRow = tuple[int, int | None, str | None]
"""`(no, position, digest)` of one message document; `None` for a field a damaged document lacks."""


@dataclass
class RunHead:
    """The newest digest at each position of one run's history, as of message number `last_no`."""

    registration: int | None
    """The run's `registration` these documents belong to (`None`: not known yet)."""
    last_no: int = 0
    latest: list[str | None] = field(default_factory=list[str | None])
    """Per history position, the digest of its newest document (`None`: no document, or an unreadable one)."""

    def apply(self, rows: Iterable[MessageRow]) -> None:
        """Add documents read in number order, up to the first missing number.

        Documents at or below `last_no` are already known and ignored. A number missing from
        `rows` ends the known sequence there (a document that a concurrent reader did not see
        yet); anything after it is learnt again later. A damaged document still takes its number:
        without a position it changes nothing, without a digest its position will be written again.
        """
        for no, position, digest in rows:
            if no <= self.last_no:
                continue
            if no != self.last_no + 1:
                return
            self.last_no = no
            if position is None:
                continue
            if position >= len(self.latest):
                self.latest.extend([None] * (position + 1 - len(self.latest)))
            self.latest[position] = digest
