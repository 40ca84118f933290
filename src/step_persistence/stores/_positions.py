"""The position model every durable store keeps its histories in, independent of any backend.

A run's history is a list of positions (message 0, 1, 2, ...). Each stored version of a message
is a numbered row (1, 2, 3, ... per run) holding its position and the digest of its encoding, and
a snapshot names its history with two integers: `history_length`, and `through_message`, the
number of the newest row it may use. Message `i` of the snapshot is the newest row at position
`i` numbered at most `through_message`. Each message is stored once per run: a save adds a row
only for the positions whose digest differs from the newest row stored there (the step's new
messages, plus the previous newest message, which pydantic-ai completes in place).

This module holds what is the same on every backend:

- `RunHead`: what a store knows of one run's rows (the newest digest per position, up to a row
  number), tied to one registration of the run (`incarnation`), so a head from before the run was
  deleted and registered again is never used;
- `plan_saves`: which rows a save of one or several histories adds on top of a head, and the
  `through_message` of each;
- `changed_positions`: the positions of a history whose message differs from the head's.

Each backend's history module turns such a plan into its own writes (SQL rows in a transaction,
file lines under a lock, MongoDB documents claimed by a unique index) and is the only place that
does. A history that starts with another stored history (a conversation's next run) fits the
same model: its positions below the other history's length resolve through a reference to that
history, and the plan numbers only the positions after it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress

from step_persistence._reading import logger

__all__ = ['MessageRow', 'NumberedRow', 'RunHead', 'SavePlan', 'changed_positions', 'plan_saves', 'plausible_position']

MessageRow = tuple[int, int | None, str | None]
"""`(no, position, digest)` of one stored message row; `None` for a field a damaged row lacks."""


def plausible_position(no: int, position: int) -> bool:
    """Whether a stored row numbered `no` can hold history position `position`.

    A history reaches position `p` only after positions `0..p-1` were stored, each in a row of its
    own with a lower number, so row `no` holds a position below `no`. A row claiming more is
    damaged: trusting it would make a reader allocate a list as long as the claimed position.
    """
    return 0 <= position < no


@dataclass(frozen=True, slots=True)
class NumberedRow:
    """A message row a save adds: its number, position and message digest."""

    no: int
    position: int
    digest: str


@dataclass
class RunHead:
    """The newest stored digest at each position of one run's history, as of row number `last_no`."""

    incarnation: int | str | None
    """The registration of the run these rows belong to (`runs.id` on SQL, the counters document's
    `registration` on MongoDB, the run directory's incarnation on files; `None`: not known yet)."""
    last_no: int = 0
    latest: list[str | None] = field(default_factory=list[str | None])
    """Per history position, the digest of its newest row (`None`: no row, or an unreadable one)."""

    def apply(self, rows: Iterable[MessageRow], *, through: int | None = None) -> None:
        """Add stored rows, read in number order.

        Rows numbered at or below `last_no` are already known and ignored, so applying the same
        rows twice changes nothing. With `through`, every number up to it is known afterwards
        (a number missing below it belongs to a row that was deleted). Without it, the known
        sequence ends at the first missing number (a row that a concurrent reader did not see
        yet): what follows is learnt again later. A damaged row still takes its number; without a
        position (or with one it cannot hold, see `plausible_position`: logged) it changes nothing,
        without a digest its position will be written again.
        """
        for no, position, digest in rows:
            if no <= self.last_no:
                continue
            if through is None and no != self.last_no + 1:
                return
            self.last_no = no
            if position is None:
                continue
            if not plausible_position(no, position):
                logger.warning('skipping damaged message row %d: it claims history position %d', no, position)
                continue
            if position >= len(self.latest):
                self.latest.extend([None] * (position + 1 - len(self.latest)))
            self.latest[position] = digest
        if through is not None:
            self.last_no = max(self.last_no, through)

    def advance(self, rows: Sequence[NumberedRow], *, through: int | None = None) -> None:
        """Add the rows a save wrote (from `plan_saves`), as `apply` does."""
        self.apply(((row.no, row.position, row.digest) for row in rows), through=through)

    def copy(self) -> RunHead:
        """An independent copy, to advance without changing this head."""
        return RunHead(incarnation=self.incarnation, last_no=self.last_no, latest=list(self.latest))


@dataclass(frozen=True)
class SavePlan:
    """The rows that saving histories in order adds on top of a head, and where each history ends."""

    rows: list[NumberedRow]
    throughs: list[int]
    """Per history, its `through_message`: the number of the newest row it may use."""
    ends: list[int]
    """Per history, how many of `rows` must be stored before its `through_message` holds."""

    def added(self, index: int) -> list[NumberedRow]:
        """The rows history `index` adds after the histories before it."""
        return self.rows[self.ends[index - 1] if index else 0 : self.ends[index]]


def plan_saves(head: RunHead, histories: Iterable[Sequence[str]]) -> SavePlan:
    """Number the changed positions of `histories` (digest lists, saved in this order) after `head.last_no`.

    `head` is not changed: advance it with the rows once they are stored.
    """
    latest = list(head.latest)
    number = head.last_no
    rows: list[NumberedRow] = []
    throughs: list[int] = []
    ends: list[int] = []
    for digests in histories:
        for position in changed_positions(digests, latest):
            number += 1
            rows.append(NumberedRow(number, position, digests[position]))
            if position >= len(latest):
                latest.extend([None] * (position + 1 - len(latest)))
            latest[position] = digests[position]
        throughs.append(number)
        ends.append(len(rows))
    return SavePlan(rows, throughs, ends)


def changed_positions(digests: Sequence[str], latest: Sequence[str | None]) -> list[int]:
    """Positions of a history whose message digest differs from `latest` (the newest stored per position).

    Positions beyond `latest` are all new. The common prefix is compared in C first, so when only
    the tail of a long history changed the cost is a fast list comparison, not a Python loop.
    """
    common = min(len(digests), len(latest))
    changed: list[int] = []
    if list(digests[:common]) != list(latest[:common]):
        changed.extend(compress(range(common), map(operator.ne, digests, latest)))
    changed.extend(range(common, len(digests)))
    return changed
