"""The position model every durable store keeps its histories in, independent of any backend.

**Lines.** Message rows are numbered in a *history line* (1, 2, 3, ... per line), not per run: a
chat's runs, each continuing the previous one, append to one line, so every message of the
conversation is stored once. Each stored version of a message is a row holding its history
position and the digest of its encoding. A snapshot names its history with its line and two
integers, its *view*: `history_length` and `through_message` (the newest row number it may use).

**Reading a view** (`ViewSegment`, `assemble`): message `i` of the view `(line, length, through)`
is the newest row of `line` at position `i` numbered at most `through`. A line may start from
another line's view, its *base* (`LineBase`: a branch, made when a run goes on from a point that
is no longer its line's newest): a position below the base's length without a row in the line
resolves in the base's view, and so on down the chain (`view_segments`).

**Saving** (`RunHead`, `plan_saves`): what a store knows of the view a run's next save builds on
is its `RunHead`: the line, that view's `through` (`last_no`) and the digest of each of its
messages (`latest`, exactly as long as the view). A save adds a row only for each position whose
digest differs (the step's new messages, plus the previous newest message, which pydantic-ai
completes in place), numbered after `last_no`. It appends to the head's line only when the line's
newest row is still number `last_no` (nobody else wrote there since); otherwise the store starts a
new line whose base is the head's view, and numbers the same rows from 1 there. Either way the
saved view reads back as exactly the saved history.

A run's head comes from, in order: the store's cache of recent saves; the view of the run's newest
snapshot; the view of its origin snapshot (`RunRecord.origin`, a continued or forked run: this is
how a conversation's next run shares its line); else it has no line yet and its first save starts
one. When the first history saved starts with a view whose `history_digest` matches, the view's
digests are that history's own, and need not be read.

**Reclaiming.** A row is used while some view uses it: a retained snapshot's, or a line's base (a
branch keeps the view it starts from). Deleting a run removes its snapshots and the rows of its
lines that no remaining view uses (a line left without views goes whole); a row numbered above the
deleted run's own views belongs to a save still in flight and stays, for `collect_media` (which
leaves rows younger than its grace on backends without transactions). So deleting, pruning or
retention of an earlier run never changes a later run's history.

This module holds what is the same on every backend; each backend's history module turns a plan
into its own writes (SQL rows in a transaction, file lines under a lock, MongoDB documents claimed
by a unique index) and is the only place that does.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import TypeVar

from step_persistence._reading import logger

__all__ = [
    'LineBase',
    'LineId',
    'MessageRow',
    'NumberedRow',
    'RunHead',
    'SavePlan',
    'ViewSegment',
    'assemble',
    'changed_positions',
    'plan_saves',
    'plausible_position',
    'view_segments',
]

LineId = int | str
"""A history line's identity: `history_lines.id` on SQL, a string on MongoDB and files. Never reused."""


MessageRow = tuple[int, int | None, str | None]
"""`(no, position, digest)` of one stored message row; `None` for a field a damaged row lacks."""


def plausible_position(no: int, position: int, *, base_length: int = 0) -> bool:
    """Whether row `no` of a line can hold history position `position` (`base_length`: what the line's base covers).

    A history reaches position `p` only after positions `0..p-1` were stored, each in a row of its
    own with a lower number or in the line's base, so row `no` holds a position below
    `base_length + no`. A row claiming more is damaged: trusting it would make a reader allocate a
    list as long as the claimed position.
    """
    return 0 <= position < base_length + no


@dataclass(frozen=True, slots=True)
class NumberedRow:
    """A message row a save adds: its number, position and message digest."""

    no: int
    position: int
    digest: str


@dataclass
class RunHead:
    """The view one run's next save builds on: its line, its `through` (`last_no`) and its digests."""

    incarnation: int | str | None
    """The registration of the run this head belongs to (`runs.id` on SQL, the counters document's
    `registration` on MongoDB, the run directory's incarnation on files; `None`: not known yet)."""
    line: LineId | None = None
    """The line the view is in (`None`: the run has no line yet; its first save starts one)."""
    last_no: int = 0
    latest: list[str | None] = field(default_factory=list[str | None])
    """Per history position of the view, the digest of its message (`None`: an unreadable row)."""
    base_length: int = 0
    """How many positions the line's base covers (0: it has none): its rows are numbered from 1 above them."""

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
            if not plausible_position(no, position, base_length=self.base_length):
                logger.warning('skipping damaged message row %d: it claims history position %d', no, position)
                continue
            if position >= len(self.latest):
                self.latest.extend([None] * (position + 1 - len(self.latest)))
            self.latest[position] = digest
        if through is not None:
            self.last_no = max(self.last_no, through)

    def advance(self, rows: Sequence[NumberedRow], *, through: int, length: int) -> None:
        """Move to the view a save wrote: `rows` (from `plan_saves`), `through`, a history of `length`."""
        self.apply(((row.no, row.position, row.digest) for row in rows), through=through)
        del self.latest[length:]

    def branched(self, line: LineId) -> RunHead:
        """The same view as the base of a new `line`: its rows will be numbered from 1 there."""
        return RunHead(
            incarnation=self.incarnation, line=line, last_no=0, latest=list(self.latest), base_length=len(self.latest)
        )

    def base(self) -> LineBase:
        """This view, as the base of a line branching from it."""
        if self.line is None:
            raise ValueError('a head without a line is no base')
        return LineBase(line=self.line, length=len(self.latest), through=self.last_no)

    def copy(self) -> RunHead:
        """An independent copy, to advance without changing this head."""
        return RunHead(
            incarnation=self.incarnation,
            line=self.line,
            last_no=self.last_no,
            latest=list(self.latest),
            base_length=self.base_length,
        )


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
        del latest[len(digests) :]
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


@dataclass(frozen=True, slots=True)
class LineBase:
    """The view a line starts from: positions below `length` without a row of their own resolve there."""

    line: LineId
    length: int
    through: int


@dataclass(frozen=True, slots=True)
class ViewSegment:
    """One line's part of reading a view: its rows numbered at most `through`, at positions below `length`."""

    line: LineId
    length: int
    through: int


def view_segments(
    line: LineId, length: int, through: int, base_of: Callable[[LineId], LineBase | None]
) -> list[ViewSegment]:
    """The lines a view reads from, its own first, each with the part of the view it may serve.

    `base_of(line)` is the line's base (`None`: it has none). Raises `ValueError` on a chain that
    comes back to a line already in it (damaged bases).
    """
    segments = [ViewSegment(line, length, through)]
    seen = {line}
    base = base_of(line)
    while base is not None:
        if base.line in seen:
            raise ValueError(f'the bases of line {line!r} form a cycle through line {base.line!r}')
        seen.add(base.line)
        segments.append(ViewSegment(base.line, min(base.length, segments[-1].length), base.through))
        base = base_of(base.line)
    return segments


_T = TypeVar('_T')


def assemble(length: int, found: Sequence[Mapping[int, _T]]) -> list[_T]:
    """A view's messages: per position, the row of the first segment (`view_segments` order) that has one.

    `found[k]` maps positions to the newest row of segment `k` there. Raises `ValueError` naming the
    first position no segment has (rows damaged or removed behind the store's back).
    """
    assembled: list[_T] = []
    for position in range(length):
        for rows in found:
            row = rows.get(position)
            if row is not None:
                assembled.append(row)
                break
        else:
            raise ValueError(f'no stored message at position {position} of {length}')
    return assembled
