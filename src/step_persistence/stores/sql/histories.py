"""Snapshot histories in the `messages` table: written once per changed position, rebuilt with one query.

Saving a snapshot writes a row only for the history positions whose message differs from the
newest row stored for that position: the step's new messages, plus the previous newest message,
which pydantic-ai completes in place (timestamps, run id) after the snapshot that first saw it.
The snapshot then names its history with two integers, `history_length` and `through_message`:
message `i` is the newest row at position `i` numbered at most `through_message`. Each new row's
message goes through the store's media policy once, when it is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai.messages import ModelMessage
from sqlalchemy import Text, and_, cast, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from step_persistence._history import EncodedMessage, changed_positions, decode_messages
from step_persistence.stores._media import MessageMedia
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.history_heads import HeadCache, MessageRow, RunHead
from step_persistence.stores.sql.rows import StoredHistory
from step_persistence.stores.sql.schema import messages, runs

__all__ = ['HistoryRows', 'SavedHistory']


@dataclass(frozen=True)
class SavedHistory:
    """What a save wrote: the snapshot's reference, and the rows to add to the run's head once committed."""

    reference: StoredHistory
    head: RunHead
    rows: list[MessageRow]


class HistoryRows:
    """Writes and reads snapshot histories in one database's `messages` table.

    With `cache_heads`, the newest digest per position of recently written runs is kept in
    memory (checked against the run's row in every write transaction); without it, each save
    reads the run's message digests (used when the caller's transaction may still roll back).
    """

    def __init__(self, database: Database, media: MessageMedia, *, cache_heads: bool) -> None:
        self._db = database
        self._media = media
        self._heads = HeadCache() if cache_heads else None

    async def save(
        self,
        connection: AsyncConnection,
        *,
        run_id: str,
        run_pk: int,
        last_no: int,
        encoded: Sequence[EncodedMessage],
    ) -> SavedHistory:
        """Write the changed positions of `encoded` (inside the caller's write transaction, which holds
        the run's row) and return the snapshot's reference to its history."""
        head = await self._head(connection, run_id=run_id, run_pk=run_pk, last_no=last_no)
        digests = [message.digest for message in encoded]
        new_rows = [
            (number, position, digests[position])
            for number, position in enumerate(changed_positions(digests, head.latest), start=last_no + 1)
        ]
        if new_rows:
            values: list[dict[str, Any]] = []
            for number, position, digest in new_rows:
                packed = await self._media.pack_message(encoded[position])
                values.append(
                    {
                        'run_id': run_id,
                        'no': number,
                        'position': position,
                        'digest': digest,
                        'body': packed.data,
                        'externalized': packed.externalized,
                    }
                )
            await self._db.execute(connection, messages.insert(), values)
            await self._db.execute(
                connection, update(runs).where(runs.c.id == run_pk).values(last_message_no=new_rows[-1][0])
            )
        through = new_rows[-1][0] if new_rows else last_no
        return SavedHistory(StoredHistory(length=len(encoded), through_message=through), head, new_rows)

    def committed(self, run_id: str, saved: SavedHistory) -> None:
        """Advance the run's cached head with the rows of a save whose transaction committed."""
        if self._heads is not None:
            saved.head.apply(saved.rows, through=saved.reference.through_message)
            self._heads.remember(run_id, saved.head)

    def forget(self, run_id: str) -> None:
        if self._heads is not None:
            self._heads.forget(run_id)

    async def _head(self, connection: AsyncConnection, *, run_id: str, run_pk: int, last_no: int) -> RunHead:
        """The run's head as of `last_no` (read inside the transaction that holds the run's row).

        A cached head that is behind reads only the rows written since; one of an earlier run with
        the same id, or ahead of the database (rows removed behind the store's back), is rebuilt.
        """
        head = self._heads.get(run_id) if self._heads is not None else None
        if head is None or head.run_pk != run_pk or head.last_no > last_no:
            head = RunHead(run_pk=run_pk)
        if head.last_no < last_no:
            statement = (
                select(messages.c.no, messages.c.position, messages.c.digest)
                .where(messages.c.run_id == run_id, messages.c.no > head.last_no, messages.c.no <= last_no)
                .order_by(messages.c.no)
            )
            found = await self._db.execute(connection, statement)
            head.apply(((no, position, digest) for no, position, digest in found), through=last_no)
        return head

    async def fetch(self, connection: AsyncConnection, run_id: str, history: StoredHistory) -> list[Any]:
        """The rows `(position, body, externalized)` that make up `history`, in position order (one query)."""
        newest = (
            select(messages.c.position, func.max(messages.c.no).label('no'))
            .where(
                messages.c.run_id == run_id,
                messages.c.position < history.length,
                messages.c.no <= history.through_message,
            )
            .group_by(messages.c.position)
            .subquery('newest')
        )
        statement = (
            select(messages.c.position, cast(messages.c.body, Text), messages.c.externalized)
            .join_from(messages, newest, and_(messages.c.run_id == run_id, messages.c.no == newest.c.no))
            .order_by(messages.c.position)
        )
        return list((await self._db.execute(connection, statement)).all())

    async def decode(self, history: StoredHistory, found: Sequence[Any]) -> list[ModelMessage]:
        """The messages of `history` from its fetched rows, media put back.

        Raises `ValueError` when a position has no row (damaged or removed rows) or a body is not a
        message, and whatever the media store raises for a missing or corrupt blob.
        """
        positions = [row[0] for row in found]
        if positions != list(range(history.length)):
            missing = sorted(set(range(history.length)) - set(positions))
            raise ValueError(f'no stored message at positions {missing[:10]} up to number {history.through_message}')
        trees = [await self._media.unpack_message(body, externalized=externalized) for _, body, externalized in found]
        return decode_messages(trees)
