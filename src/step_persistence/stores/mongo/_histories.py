"""Writing snapshot histories as message documents, one per changed position, safely under concurrent writers.

Saving a snapshot stores a document only for the history positions whose message differs from
the newest document stored for that position: the step's new messages, plus the previous newest
message, which pydantic-ai completes in place (timestamps, run id) after the snapshot that first
saw it. The snapshot then names its history with two integers: its length, and `through`, the
number of the last message document it may use.

Without transactions, message numbers are claimed by inserting the documents themselves (the
unique `(run_id, no)` index): a writer numbers its documents right after its head's `last_no`
and inserts them in order. If another writer took one of those numbers first, the documents
inserted up to there are kept (they are valid versions, known to every later writer), the head
catches up with what the other writer stored, and the rest is planned and inserted again. A
snapshot's `through` is fixed only once every document before it is in place, so it always means
exactly the history it was saved with.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from step_persistence._history import EncodedMessage
from step_persistence.stores._media import PackedMessage
from step_persistence.stores._positions import changed_positions
from step_persistence.stores.mongo._heads import RunHead
from step_persistence.stores.mongo._messages import MessageStore, message_document

__all__ = ['HistoryWrite']

_MAX_ATTEMPTS: Final = 64
"""How many times a write re-plans after losing message numbers to other writers before giving up."""


@dataclass(frozen=True, slots=True)
class _Slot:
    """A message document to store: its number, position and message digest."""

    no: int
    position: int
    digest: str


@dataclass(frozen=True)
class _Plan:
    """The documents that histories need on top of a head, and where each history ends among them."""

    slots: list[_Slot]
    throughs: list[int]
    """Per history, the number of the last document it may use."""
    ends: list[int]
    """Per history, how many of `slots` must be stored before its `through` holds."""


def _plan(head: RunHead, histories: Sequence[Sequence[str]]) -> _Plan:
    """Number the changed positions of `histories` (digest lists, saved in order) after `head.last_no`."""
    latest = list(head.latest)
    number = head.last_no
    slots: list[_Slot] = []
    throughs: list[int] = []
    ends: list[int] = []
    for digests in histories:
        for position in changed_positions(digests, latest):
            number += 1
            slots.append(_Slot(number, position, digests[position]))
            if position >= len(latest):
                latest.extend([None] * (position + 1 - len(latest)))
            latest[position] = digests[position]
        throughs.append(number)
        ends.append(len(slots))
    return _Plan(slots, throughs, ends)


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
        await self._pack(_plan(head, self._digests).slots)

    async def write(self, head: RunHead) -> list[int]:
        """Store the message documents and return each history's `through`; `head` advances with them.

        `head` must be the run's (right registration); it may be behind other writers.
        """
        throughs: list[int] = []
        remaining = self._digests
        for _ in range(_MAX_ATTEMPTS):
            plan = _plan(head, remaining)
            await self._pack(plan.slots)
            documents = [
                message_document(
                    self._run_id,
                    no=slot.no,
                    position=slot.position,
                    digest=slot.digest,
                    packed=self._packed[slot.digest],
                )
                for slot in plan.slots
            ]
            inserted = await self._messages.insert(documents)
            head.apply((slot.no, slot.position, slot.digest) for slot in plan.slots[:inserted])
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

    async def _pack(self, slots: Sequence[_Slot]) -> None:
        for slot in slots:
            if slot.digest not in self._packed:
                self._packed[slot.digest] = await self._messages.pack(self._run_id, self._encoded[slot.digest])
