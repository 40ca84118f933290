"""Writing snapshot histories as message documents, one per changed position, safely under concurrent writers.

The history model (positions, numbered rows, `through_message`) is the shared one of
`stores/_positions.py`; this module is the only place that turns its plans into MongoDB writes.
Without transactions, message numbers are claimed by inserting the documents themselves (the
unique `(run_id, no)` index), so the numbers in use always form one unbroken sequence and a head
learns them with `RunHead.apply` (no `through`: it stops at the first number not seen yet).

One save, step by step:

1. `plan_saves(head, histories)` numbers the changed positions right after `head.last_no`.
2. The planned documents are inserted in number order (`MessageStore.insert`, ordered).
3. If another writer took one of those numbers first, the documents inserted up to there are kept
   (they are valid versions, known to every later writer), `head` advances by them and catches up
   with what the other writer stored, and the histories not yet settled are planned and inserted
   again.
4. A history's `through` (its snapshot's `through_message`) is returned only once every document
   before it is in place, so it always means exactly the history it was saved with; `_writes.py`
   then inserts the snapshot documents that name it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Final

from step_persistence._history import EncodedMessage
from step_persistence.stores._media import PackedMessage
from step_persistence.stores._positions import NumberedRow, RunHead, plan_saves
from step_persistence.stores.mongo._messages import MessageStore, message_document

__all__ = ['HistoryWrite']

_MAX_ATTEMPTS: Final = 64
"""How many times a write re-plans after losing message numbers to other writers before giving up."""


class HistoryWrite:
    """The histories of one run's snapshots, saved in order by one write."""

    def __init__(self, messages: MessageStore, run_id: str, histories: Sequence[Sequence[EncodedMessage]]) -> None:
        self._messages = messages
        self._run_id = run_id
        self._digests = [[message.digest for message in history] for history in histories]
        self._encoded = {message.digest: message for history in histories for message in history}
        self._packed: dict[str, PackedMessage] = {}

    async def prepare(self, head: RunHead) -> None:
        """Pack the messages the write needs on top of `head` (payloads go to the media store now).

        Raises `ValueError` if one would exceed the document size limit, so that a caller doing
        this before its first write leaves the database untouched.
        """
        await self._pack(plan_saves(head, self._digests).rows)

    async def write(self, head: RunHead) -> list[int]:
        """Store the message documents and return each history's `through`; `head` advances with them.

        `head` must be the run's (its `incarnation` the run's `registration`); it may be behind
        other writers.
        """
        throughs: list[int] = []
        remaining = self._digests
        for _ in range(_MAX_ATTEMPTS):
            plan = plan_saves(head, remaining)
            await self._pack(plan.rows)
            documents = [
                message_document(
                    self._run_id, no=row.no, position=row.position, digest=row.digest, packed=self._packed[row.digest]
                )
                for row in plan.rows
            ]
            inserted = await self._messages.insert(documents)
            head.advance(plan.rows[:inserted])
            settled = bisect_right(plan.ends, inserted)
            throughs.extend(plan.throughs[:settled])
            remaining = remaining[settled:]
            if not remaining:
                return throughs
            await self._messages.catch_up(self._run_id, head)
        raise RuntimeError(
            f'gave up saving messages of run {self._run_id!r}: other writers took the next message number '
            f'{_MAX_ATTEMPTS} times in a row'
        )

    async def _pack(self, rows: Sequence[NumberedRow]) -> None:
        for row in rows:
            if row.digest not in self._packed:
                self._packed[row.digest] = await self._messages.pack(self._run_id, self._encoded[row.digest])
