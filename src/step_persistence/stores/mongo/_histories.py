"""Writing snapshot histories as message documents on a line, safely under concurrent writers.

The history model (lines, numbered rows, views, bases) is the shared one of `stores/_positions.py`;
this module is the only place that turns its plans into MongoDB writes. There are no
transactions: a number is claimed by inserting its document (the unique `(line, no)` index), and
numbers are never freed while their line exists (reclaiming leaves a tombstone, `_reclaiming.py`),
so the numbers of a line always run 1, 2, ... up to its newest, with no gap. Claiming number
`head.last_no + 1` therefore succeeds exactly when the line's newest row is still the head's own
`through`: nobody else wrote on the line since the view the head is.

One save, step by step (`_heads.py` found the head first):

1. `plan_saves(head, histories)` numbers the changed positions right after `head.last_no`. A head
   without a line (a run's first save, with no origin) gets a fresh one, numbered from 1.
2. `attempt` plans the documents; the batch's writer inserts them in number order on the head's
   line, ordered, within its own list of writes (`_writes.py`), and `settle` goes on from how
   many landed.
3. If number `head.last_no + 1` was taken (another run or writer appended there since), nothing
   was inserted: the save branches. A `lines` document for a new line whose base is the head's
   view is written (`LineBases.branch`), the same positions are planned on it from number 1
   (`RunHead.branched`: same digests, so packed media stay valid), and inserted there. A head on
   a legacy line (messages written before lines) always branches: such lines have no unique
   numbers to claim.
4. If a number further on was taken (only damage or an interrupted writer can do that), the
   histories whose documents are all in are settled on the line, and the rest branch from the
   newest settled one.
5. Each history's view `(line, through)` is returned once every document it needs is in, so it
   always means exactly the history it was saved with (`landed`: every document of an attempt
   in); the snapshot documents that name it come after them in `_writes.py`'s ordered list, or
   are inserted after `settle`. The head moves to the last history's view.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from step_persistence._history import EncodedMessage
from step_persistence.stores._media import PackedMessage
from step_persistence.stores._positions import NumberedRow, RunHead, SavePlan, plan_saves
from step_persistence.stores.mongo._lines import LineBases, as_line, fresh_line, is_legacy
from step_persistence.stores.mongo._messages import MessageStore, message_document

__all__ = ['Attempt', 'HistoryWrite', 'SavedView']

_MAX_ATTEMPTS: Final = 16
"""How many lines a write tries before giving up (each attempt after the first is on a fresh branch)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try at saving histories on a line: the head it builds on, the histories, their plan and documents."""

    head: RunHead
    remaining: list[list[str]]
    plan: SavePlan
    documents: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class SavedView:
    """Where one saved history is: its line (`None` for an empty history) and its `through_message`."""

    line: str | None
    through: int


class HistoryWrite:
    """The histories of one run's snapshots, saved in order by one write."""

    def __init__(
        self, messages: MessageStore, bases: LineBases, run_id: str, histories: Sequence[Sequence[EncodedMessage]]
    ) -> None:
        self._messages = messages
        self._bases = bases
        self._run_id = run_id
        self.digests = [[message.digest for message in history] for history in histories]
        """Per history, the digests of its messages."""
        self._encoded = {message.digest: message for history in histories for message in history}
        self._packed: dict[str, PackedMessage] = {}

    async def prepare(self, head: RunHead) -> None:
        """Pack the messages the write needs on top of `head` (payloads go to the media store now).

        Raises `ValueError` if one would exceed the document size limit, so that a caller doing
        this before its first write leaves the database untouched.
        """
        await self._pack(plan_saves(head, self.digests).rows)

    async def attempt(self, head: RunHead) -> Attempt:
        """The first try at saving every history on top of `head` (its documents not yet inserted).

        A head without a line gets a fresh one; one on a legacy line branches now (a `lines`
        document is written).
        """
        return await self._attempt(head, self.digests)

    async def settle(self, attempt: Attempt, inserted: int) -> tuple[list[SavedView], RunHead]:
        """Finish the write once the first `inserted` documents of `attempt` are in, inserted in number order
        (fewer than all: the next number was taken); return each history's view and the head after the last.

        The attempt's head must be the run's (its `incarnation` the run's `registration`).
        """
        views: list[SavedView] = []
        for _ in range(_MAX_ATTEMPTS):
            if inserted >= len(attempt.documents):
                landed, head = self.landed(attempt)
                return views + landed, head
            head, remaining, plan = attempt.head, attempt.remaining, attempt.plan
            settled = bisect_right(plan.ends, inserted)
            views.extend(SavedView(as_line(head.line), through) for through in plan.throughs[:settled])
            if settled:
                head = self._after(head, remaining[settled - 1], plan.throughs[settled - 1])
                remaining = remaining[settled:]
            attempt = await self._attempt(head.branched(await self._bases.branch(head.base())), remaining)
            inserted = await self._messages.insert(attempt.documents)
        raise RuntimeError(
            f'gave up saving messages of run {self._run_id!r}: the next message number was taken on '
            f'{_MAX_ATTEMPTS} lines in a row'
        )

    def landed(self, attempt: Attempt) -> tuple[list[SavedView], RunHead]:
        """Each history's view and the head after the last one, once every document of `attempt` is in."""
        if not attempt.remaining:
            return [], attempt.head
        head, plan = attempt.head, attempt.plan
        views = [SavedView(as_line(head.line), through) for through in plan.throughs]
        return views, self._after(head, attempt.remaining[-1], plan.throughs[-1])

    async def _attempt(self, head: RunHead, remaining: list[list[str]]) -> Attempt:
        plan = plan_saves(head, remaining)
        if plan.rows and head.line is None:
            head = RunHead(incarnation=head.incarnation, line=fresh_line())
            plan = plan_saves(head, remaining)
        elif plan.rows and is_legacy(str(head.line)):
            head = head.branched(await self._bases.branch(head.base()))
            plan = plan_saves(head, remaining)
        await self._pack(plan.rows)
        documents = [
            message_document(
                str(head.line),
                self._run_id,
                no=row.no,
                position=row.position,
                digest=row.digest,
                packed=self._packed[row.digest],
            )
            for row in plan.rows
        ]
        return Attempt(head=head, remaining=remaining, plan=plan, documents=documents)

    @staticmethod
    def _after(head: RunHead, digests: Sequence[str], through: int) -> RunHead:
        """The head once the history `digests` is saved on `head`'s line through `through`: exactly its view."""
        return RunHead(incarnation=head.incarnation, line=head.line, last_no=through, latest=list(digests))

    async def _pack(self, rows: Sequence[NumberedRow]) -> None:
        for row in rows:
            if row.digest not in self._packed:
                self._packed[row.digest] = await self._messages.pack(self._run_id, self._encoded[row.digest])
