"""Reading snapshots: each snapshot row and its history's message rows in one read transaction, decoded after it.

Message `i` of a snapshot is the newest row of its line at position `i` numbered at most its
`through_message`, or else message `i` of the line's base view (the position model of
`stores/_positions.py`, written by `snapshot_saves.py`): one query per line of the view's chain
(`views.py`; a chat's runs share one line, so usually one query). Putting media back is async, so
messages are decoded after the transaction. A snapshot whose fields or messages cannot be read is
logged and skipped; `latest` then reads the one before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import Text, cast, select

from step_persistence._history import decode_messages
from step_persistence._reading import logger, read_or_skip, read_or_skip_async
from step_persistence.records import ContinuableSnapshot
from step_persistence.stores._media import MessageMedia
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.rows import StoredHistory
from step_persistence.stores.sql.schema import messages, snapshots
from step_persistence.stores.sql.views import LineBases, segment_query, view_rows

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

__all__ = ['SnapshotReads']


@dataclass(frozen=True)
class _Fetched:
    """A snapshot row and its message rows, read in one transaction, not yet decoded."""

    header: ContinuableSnapshot
    history: StoredHistory
    found: Sequence[Any]


class SnapshotReads:
    """The snapshots of one database's runs, their media put back through the store's media policy."""

    def __init__(self, database: Database, media: MessageMedia) -> None:
        self._db = database
        self._media = media

    async def latest(self, run_id: str, *, include_interrupted: bool) -> ContinuableSnapshot | None:
        """The run's readable snapshot with the highest `seq` (only complete ones unless `include_interrupted`)."""
        query = _headers(run_id, include_interrupted).order_by(snapshots.c.seq.desc()).limit(1)
        while True:
            fetched = await self._db.run(partial(_fetch, run_id=run_id, query=query), write=False)
            if not fetched:
                return None
            seq, candidate = fetched[0]
            snapshot = None if candidate is None else await self._decode(run_id, candidate)
            if snapshot is not None:
                return snapshot
            query = query.where(snapshots.c.seq < seq)

    async def every(self, run_id: str, *, include_interrupted: bool) -> list[ContinuableSnapshot]:
        """The run's readable snapshots in `seq` order (only complete ones unless `include_interrupted`)."""
        query = _headers(run_id, include_interrupted).order_by(snapshots.c.seq)
        fetched = await self._db.run(partial(_fetch, run_id=run_id, query=query), write=False)
        decoded = [await self._decode(run_id, candidate) for _, candidate in fetched if candidate is not None]
        return [snapshot for snapshot in decoded if snapshot is not None]

    async def _decode(self, run_id: str, fetched: _Fetched) -> ContinuableSnapshot | None:
        """The snapshot with its messages (media restored), or `None` (logged) if they cannot be read."""

        async def decode() -> ContinuableSnapshot:
            decoded = await self._messages(fetched.found)
            return fetched.header.model_copy(update={'messages': decoded})

        return await read_or_skip_async(f'snapshot {fetched.header.seq} of run {run_id!r}', decode)

    async def _messages(self, found: Sequence[Any]) -> list[ModelMessage]:
        """The messages of a history from its fetched rows (one per position), media put back.

        Raises `ValueError` when a body stored as it is does not hash to its digest or is not a message,
        and whatever the media store raises for a missing or corrupt blob.
        """
        for position, digest, body, externalized in found:
            # Stored as it is, a message's body is the encoding its digest is of: a body changed behind
            # the store's back is never returned as the message. (An externalized body is checked
            # through its blobs' digests.)
            if not externalized and not _is_encoding_of(body, digest):
                raise ValueError(f'the message at position {position} does not match its digest')
        trees = [
            await self._media.unpack_message(body, externalized=bool(externalized))
            for _, _, body, externalized in found
        ]
        return decode_messages(trees)


def _headers(run_id: str, include_interrupted: bool) -> Any:
    statement = select(*rows.SNAPSHOT_HEADER_COLUMNS).where(snapshots.c.run_id == run_id)
    return statement if include_interrupted else statement.where(snapshots.c.state == 'complete')


def _fetch(transaction: Transaction, run_id: str, query: Any) -> list[tuple[int, _Fetched | None]]:
    """Every snapshot row of `query`: its `seq`, and the row with its message rows, or `None` if its fields
    or its view cannot be read (logged)."""
    fetched: list[tuple[int, _Fetched | None]] = []
    bases = LineBases(transaction)
    for row in rows.fetch(transaction, query):
        name = f'snapshot {row.seq} of run {run_id!r}'
        parsed = read_or_skip(name, partial(rows.snapshot_header_from_row, row._mapping))
        if parsed is None:
            fetched.append((row.seq, None))
            continue
        try:
            found = view_rows(transaction, parsed[1], _BODIES, bases)
        except ValueError as error:  # rows or bases damaged or removed; a database error is not caught
            logger.warning('skipping unreadable %s: %r', name, error)
            fetched.append((row.seq, None))
            continue
        fetched.append((row.seq, _Fetched(*parsed, found)))
    return fetched


_BODIES = segment_query(messages.c.digest, cast(messages.c.body, Text), messages.c.externalized)
"""Per position of a view: `(position, digest, body, externalized)`."""


def _is_encoding_of(body: object, digest: object) -> bool:
    return isinstance(body, str) and hashlib.sha256(body.encode('utf-8', 'surrogatepass')).hexdigest() == digest
