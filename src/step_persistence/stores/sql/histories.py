"""Snapshot histories in the `messages` table: written once per changed position, rebuilt with one query.

Saving a snapshot writes a row only for the history positions whose message differs from the
newest row stored for that position: the step's new messages, plus the previous newest message,
which pydantic-ai completes in place (timestamps, run id) after the snapshot that first saw it.
The snapshot then names its history with two integers, `history_length` and `through_message`:
message `i` is the newest row at position `i` numbered at most `through_message`.

Each new row's message goes through the store's media policy once, when it is written. The
media walker is async and the write transaction is a synchronous function, so a write happens
in two phases:

1. `prepare` (async, before the transaction): from the run's head (the newest digest per
   position, cached per process, read from the database when unknown), find the messages the
   save will add and pack them; blobs bound for the SQL media store of the same database are
   staged (`StagedBlobs`), blobs for any other media store are put there now.
2. `write` (inside the transaction, which holds the run's row): check the head against
   `runs.last_message_no`. If another writer added rows meanwhile, catch the head up with the
   rows written since; should that make a message new that was not packed, raise `NeedsPacking`,
   and the store refreshes the head, prepares again and retries the transaction.

With `media_store=None` packing is the message's own bytes, done inside the transaction, so no
head is needed beforehand and a save never retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import ModelMessage
from sqlalchemy import Text, and_, bindparam, cast, func, select

from step_persistence._history import EncodedMessage, decode_messages
from step_persistence.media.protocol import MediaStore
from step_persistence.media.walker import MARKER_KEY
from step_persistence.records import ContinuableSnapshot
from step_persistence.stores._media import MessageMedia, PackedMessage
from step_persistence.stores._positions import changed_positions
from step_persistence.stores.sql.blobs import BlobWriter, StagedBlobs
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.history_heads import HeadCache, MessageRow, RunHead
from step_persistence.stores.sql.rows import RUN_KEY, StoredHistory
from step_persistence.stores.sql.schema import messages, runs
from step_persistence.stores.sql.statements import WriteStatements

__all__ = ['HistoryPlan', 'HistoryRows', 'NeedsPacking']


class NeedsPacking(Exception):
    """A message the transaction must write was not packed beforehand: refresh the run's head and retry."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f'run {run_id!r} changed while its snapshot was being prepared')
        self.run_id = run_id


@dataclass
class HistoryPlan:
    """What one write operation prepared for the histories it saves."""

    heads: dict[str, RunHead] = field(default_factory=dict[str, RunHead])
    """Per run, the head the transaction starts from (a copy), advanced as it writes."""
    packed: dict[str, PackedMessage] = field(default_factory=dict[str, PackedMessage])
    """Packed messages by digest."""
    staged: StagedBlobs | None = None
    """Blob rows for the transaction to insert (the SQL media store of this database)."""
    packs_inline: bool = False
    """No media store: a message is stored as its own bytes, packed inside the transaction."""
    expected_rows: list[int] = field(default_factory=list[int])
    """Per snapshot of the write, in order, how many message rows it should add, as predicted from the
    heads: the statement that allocates its sequence number reserves that many message numbers."""

    def body(self, run_id: str, message: EncodedMessage) -> PackedMessage:
        packed = self.packed.get(message.digest)
        if packed is not None:
            return packed
        if self.packs_inline:
            return PackedMessage(message.data, externalized=False)
        raise NeedsPacking(run_id)


class HistoryRows:
    """Writes and reads snapshot histories in one database's `messages` table.

    With `cache_heads`, the head of recently written runs is kept in memory; without it (the
    caller's transaction may still roll back), each save reads the run's digests.
    `staged_media` is the media store whose puts a write stages for its own transaction (the SQL
    media store on this database), if any.
    """

    def __init__(
        self,
        database: Database,
        media: MessageMedia,
        statements: WriteStatements,
        *,
        staged_media: MediaStore | None,
        cache_heads: bool,
    ) -> None:
        self._db = database
        self._media = media
        self._statements = statements
        self._staged_media = staged_media
        self._heads = HeadCache() if cache_heads else None
        self._blobs = BlobWriter(database.dialect_name)
        self._rows_since = (
            select(messages.c.no, messages.c.position, messages.c.digest)
            .where(
                messages.c.run_id == bindparam(RUN_KEY),
                messages.c.no > bindparam('after'),
                messages.c.no <= bindparam('through'),
            )
            .order_by(messages.c.no)
        )
        self._run_row = select(runs.c.id, runs.c.last_message_no).where(runs.c.run_id == bindparam(RUN_KEY))

    # --- before the write transaction ---

    async def prepare(self, snapshots: Sequence[ContinuableSnapshot], *, refresh: str | None = None) -> HistoryPlan:
        """Pack the messages `snapshots` will add, from the runs' heads (`refresh`: re-read that run's head)."""
        new: dict[str, EncodedMessage] = {}
        if self._media.store is None:
            plan = HistoryPlan(heads=self._cached_heads(snapshots), packs_inline=True)
            plan.expected_rows = _expected_rows(plan.heads, snapshots, new)
            return plan
        plan = HistoryPlan()
        media = self._media
        if self._media.store is self._staged_media:
            plan.staged = StagedBlobs(self._media.store)
            media = MessageMedia(store=plan.staged, threshold_bytes=self._media.threshold_bytes)
        for run_id in dict.fromkeys(snapshot.run_id for snapshot in snapshots):
            head = None if run_id == refresh else self._cached(run_id)
            if head is None:
                head = await self._read_head(run_id)
            if head is not None:  # an unknown run: the transaction raises LookupError
                plan.heads[run_id] = head.copy()
        plan.expected_rows = _expected_rows(plan.heads, snapshots, new)
        for digest, message in new.items():
            if _has_no_media(message, media.threshold_bytes):
                plan.packed[digest] = PackedMessage(message.data, externalized=False)
            else:
                plan.packed[digest] = await media.pack_message(message)
        return plan

    def _cached(self, run_id: str) -> RunHead | None:
        return None if self._heads is None else self._heads.get(run_id)

    def _cached_heads(self, snapshots: Sequence[ContinuableSnapshot]) -> dict[str, RunHead]:
        found = ((snapshot.run_id, self._cached(snapshot.run_id)) for snapshot in snapshots)
        return {run_id: head.copy() for run_id, head in found if head is not None}

    async def _read_head(self, run_id: str) -> RunHead | None:
        """The run's committed head, read from the database; `None` for an unknown run."""

        def read(transaction: Transaction) -> RunHead | None:
            row = transaction.execute(self._run_row, {RUN_KEY: run_id}).first()
            if row is None:
                return None
            head = RunHead(run_pk=row.id)
            self._catch_up(transaction, run_id, head, row.last_message_no)
            return head

        head = await self._db.run(read, write=False)
        if head is not None and self._heads is not None:
            self._heads.remember(run_id, head.copy())
        return head

    # --- inside the write transaction ---

    def write_blobs(self, transaction: Transaction, plan: HistoryPlan) -> None:
        """Insert the blob rows the plan staged (before the messages that refer to them)."""
        if plan.staged is not None:
            self._blobs.write(transaction, plan.staged.rows)

    def write(
        self,
        transaction: Transaction,
        plan: HistoryPlan,
        *,
        run_id: str,
        run_pk: int,
        last_no: int,
        reserved: int,
        encoded: Sequence[EncodedMessage],
    ) -> StoredHistory:
        """Write the changed positions of `encoded` and return the snapshot's reference to its history.

        The transaction holds the run's row: its `last_message_no` was `last_no`, and is now
        `last_no + reserved` (the rows the plan expected); it is corrected if the rows written differ.
        """
        head = plan.heads.get(run_id)
        if head is None or head.run_pk != run_pk or head.last_no > last_no:
            head = plan.heads[run_id] = RunHead(run_pk=run_pk)
        if head.last_no < last_no:
            self._catch_up(transaction, run_id, head, last_no)
        digests = [message.digest for message in encoded]
        new_rows: list[MessageRow] = []
        values: list[dict[str, Any]] = []
        for number, position in enumerate(changed_positions(digests, head.latest), start=last_no + 1):
            packed = plan.body(run_id, encoded[position])
            new_rows.append((number, position, digests[position]))
            values.append(
                {
                    'run_id': run_id,
                    'no': number,
                    'position': position,
                    'digest': digests[position],
                    'body': packed.data,
                    'externalized': packed.externalized,
                }
            )
        through = new_rows[-1][0] if new_rows else last_no
        if new_rows:
            transaction.execute(self._statements.insert_messages, values)
        if through != last_no + reserved:
            transaction.execute(self._statements.advance_messages, {'pk': run_pk, 'last_no': through})
        head.apply(new_rows, through=through)
        return StoredHistory(length=len(encoded), through_message=through)

    def _catch_up(self, transaction: Transaction, run_id: str, head: RunHead, last_no: int) -> None:
        """Advance `head` with the run's rows numbered after it, up to `last_no`."""
        found = transaction.execute(self._rows_since, {RUN_KEY: run_id, 'after': head.last_no, 'through': last_no})
        head.apply(((no, position, digest) for no, position, digest in found), through=last_no)

    # --- after the write transaction ---

    def committed(self, plan: HistoryPlan) -> None:
        """Remember the heads of a plan whose transaction committed."""
        if self._heads is not None:
            for run_id, head in plan.heads.items():
                self._heads.remember(run_id, head)

    def registered(self, run_id: str, run_pk: int) -> None:
        """Remember the empty head of a run just registered (committed)."""
        if self._heads is not None:
            self._heads.remember(run_id, RunHead(run_pk=run_pk))

    def forget(self, run_id: str) -> None:
        if self._heads is not None:
            self._heads.forget(run_id)

    # --- reads ---

    def fetch(self, transaction: Transaction, run_id: str, history: StoredHistory) -> list[Any]:
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
        return list(transaction.execute(statement).all())

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


_MEDIA_SIGNS = (b'"binary"', MARKER_KEY.encode())
"""What the JSON of a message the media walker would change must contain: a `BinaryContent`'s
`"kind":"binary"`, or a dict keyed like a marker (which the walker escapes)."""


def _has_no_media(message: EncodedMessage, threshold_bytes: int) -> bool:
    """Whether packing `message` certainly leaves it as it is, told from its bytes without parsing them.

    Its JSON being shorter than the threshold bounds the UTF-8 size of every string in it, and
    without the signs above nothing in it is binary or marker-like: the walker would return the
    tree unchanged, and `MessageMedia.pack_message` the message's own bytes.
    """
    data = message.data
    return len(data) < threshold_bytes and not any(sign in data for sign in _MEDIA_SIGNS)


def _expected_rows(
    heads: dict[str, RunHead], snapshots: Sequence[ContinuableSnapshot], new: dict[str, EncodedMessage]
) -> list[int]:
    """Per snapshot, the message rows its save would add after the previous ones, from copies of `heads`
    (0 for a run without a head); the messages those rows hold are added to `new`."""
    predicted = {run_id: head.copy() for run_id, head in heads.items()}
    expected: list[int] = []
    for snapshot in snapshots:
        head = predicted.get(snapshot.run_id)
        expected.append(0 if head is None else _predict(head, snapshot.encoded_messages(), new))
    return expected


def _predict(head: RunHead, encoded: Sequence[EncodedMessage], new: dict[str, EncodedMessage]) -> int:
    """Add to `new` the messages a save of `encoded` would write after `head`, advance `head` as it would,
    and return how many rows that is."""
    digests = [message.digest for message in encoded]
    rows = [
        (number, position, digests[position])
        for number, position in enumerate(changed_positions(digests, head.latest), start=head.last_no + 1)
    ]
    for _, position, digest in rows:
        new.setdefault(digest, encoded[position])
    if rows:
        head.apply(rows, through=rows[-1][0])
    return len(rows)
