"""Saving snapshots: the one place that reserves, packs, numbers and writes a snapshot's message rows.

A snapshot's history is stored in the position model of `stores/_positions.py`: a `messages`
row (`no`, `position`, `digest`, `body`) only for each position whose message differs from the
newest row stored there, and the snapshot row names its history with `history_length` and
`through_message`. What the store knows of a run's rows is its `RunHead`, whose incarnation is
`runs.id` (never reused, so a head from before the run was deleted and registered again is never
used); the heads of recently written runs are cached (`BoundedLru`), except in a caller's
transaction, which may still roll back.

One `write_batch` (a flush: tool effects, events and snapshots), in order:

1. Before any transaction (`_prepare`): each run's head comes from the cache, or from a read
   transaction of its own (`runs.id`, `runs.last_message_no` and the rows up to it; an unknown run
   has none). `plan_saves` numbers the rows each snapshot adds after the previous ones; those
   messages are packed through the media policy. Blobs bound for this database's `SqlMediaStore`
   are staged (`StagedBlobs`) for the transaction; blobs for any other media store are stored now.
   With `media_store=None` a message is its own bytes: the heads come from the cache only, and the
   rows are packed inside the transaction.
2. One write transaction (`_write`; on SQLite `BEGIN IMMEDIATE`): the staged blob rows, the tool
   effects and events (`writes.py`), then per snapshot, in order (`_save`):
   a. the snapshot's idempotency key, if any, is claimed (a key the run used already ends the
      save: the run has that snapshot); then one `UPDATE runs ... RETURNING` (on PostgreSQL the
      same statement as the claim) takes the run's next `last_snapshot_seq` and adds the planned
      row count to `last_message_no`. It holds the run's row until commit, so writers of one run,
      in any process, take turns here; what it returns, minus the reservation, is where this
      save's numbers start;
   b. if the head lags behind that number (another writer added rows), the rows since are read
      into it; a head of an earlier registration starts over empty. The changed positions are
      numbered from there and inserted in one statement; should one of them hold a message that was
      not packed in step 1, `NeedsPacking` rolls the whole transaction back;
   c. only when the rows written differ from the reservation, a second statement corrects
      `last_message_no`; then the snapshot row is inserted, and with `max_snapshots_per_run` the
      run's snapshots that retention no longer keeps (`retained_seqs`) are deleted.
3. After `NeedsPacking`, the run's head is read again and both steps run again. After the commit,
   the advanced heads go to the cache, for the next save to plan from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy import bindparam, select

from step_persistence._history import EncodedMessage
from step_persistence._lru import BoundedLru
from step_persistence.media.protocol import MediaStore
from step_persistence.media.walker import MARKER_KEY
from step_persistence.records import ContinuableSnapshot, SnapshotState, StepWrites
from step_persistence.retention import retained_seqs
from step_persistence.stores._media import MessageMedia, PackedMessage
from step_persistence.stores._positions import RunHead, plan_saves
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.blobs import BlobWriter, StagedBlobs
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.rows import RUN_KEY, StoredHistory
from step_persistence.stores.sql.schema import messages, runs
from step_persistence.stores.sql.statements import WriteStatements
from step_persistence.stores.sql.writes import Writes, require_run

__all__ = ['HEADS_CACHED', 'NeedsPacking', 'SnapshotSaves']

HEADS_CACHED = 256
"""How many runs' heads a store keeps in memory (the least recently used is forgotten)."""

_RUN_ROW = select(runs.c.id, runs.c.last_message_no).where(runs.c.run_id == bindparam(RUN_KEY))
_ROWS_SINCE = (
    select(messages.c.no, messages.c.position, messages.c.digest)
    .where(
        messages.c.run_id == bindparam(RUN_KEY),
        messages.c.no > bindparam('after'),
        messages.c.no <= bindparam('through'),
    )
    .order_by(messages.c.no)
)


class NeedsPacking(Exception):
    """A message the transaction must write was not packed beforehand: refresh the run's head and retry."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f'run {run_id!r} changed while its snapshot was being prepared')
        self.run_id = run_id


@dataclass
class _Prepared:
    """What one write operation prepared for its snapshots before its transaction."""

    heads: dict[str, RunHead] = field(default_factory=dict[str, RunHead])
    """Per run, the head the transaction starts from (a copy), advanced as it writes."""
    reserved: list[int] = field(default_factory=list[int])
    """Per snapshot, in order, how many message rows it adds as planned from `heads` (0 for a run without
    one): the message numbers its allocation reserves."""
    packed: dict[str, PackedMessage] = field(default_factory=dict[str, PackedMessage])
    """Packed messages by digest."""
    staged: StagedBlobs | None = None
    """Blob rows for the transaction to insert (the SQL media store of this database)."""
    packs_inline: bool = False
    """No media store: a message is stored as its own bytes, packed inside the transaction."""

    def body(self, run_id: str, message: EncodedMessage) -> PackedMessage:
        packed = self.packed.get(message.digest)
        if packed is not None:
            return packed
        if self.packs_inline:
            return PackedMessage(message.data, externalized=False)
        raise NeedsPacking(run_id)


@dataclass(frozen=True, slots=True)
class _Allocation:
    run_pk: int
    """`runs.id`: the incarnation of the run's head."""
    seq: int
    """The snapshot's sequence number."""
    after: int
    """The number of the run's newest message row before this save: its rows are numbered after it."""


class SnapshotSaves:
    """Writes flushes and their snapshots to one database (see the module docstring).

    `staged_media` is the media store whose puts a save stages for its own transaction (the SQL
    media store on this database), if any. With `cache_heads`, the heads of recently written runs
    are kept in memory; without it (the caller's transaction may still roll back), each save reads
    the run's head.
    """

    def __init__(
        self,
        database: Database,
        media: MessageMedia,
        statements: WriteStatements,
        writes: Writes,
        *,
        staged_media: MediaStore | None,
        cache_heads: bool,
        max_snapshots: int | None,
    ) -> None:
        self._db = database
        self._media = media
        self._statements = statements
        self._writes = writes
        self._staged_media = staged_media
        self._heads: BoundedLru[str, RunHead] | None = BoundedLru(HEADS_CACHED) if cache_heads else None
        self._max_snapshots = max_snapshots
        self._blobs = BlobWriter(database.dialect_name)

    async def write_batch(self, batch: StepWrites) -> None:
        """Tool effects, then events, then snapshots, each in list order, in one transaction."""
        refresh: str | None = None
        while True:
            prepared = await self._prepare(batch.snapshots, refresh=refresh)
            try:
                await self._db.run(partial(self._write, batch=batch, prepared=prepared), write=True)
            except NeedsPacking as stale:
                refresh = stale.run_id
                continue
            for run_id, head in prepared.heads.items():
                self._remember(run_id, head)
            return

    def registered(self, run_id: str, run_pk: int) -> None:
        """Remember the empty head of a run just registered (committed)."""
        self._remember(run_id, RunHead(incarnation=run_pk))

    def forget(self, run_id: str) -> None:
        """Drop the head of a run just deleted."""
        if self._heads is not None:
            self._heads.pop(run_id)

    def _cached(self, run_id: str) -> RunHead | None:
        return None if self._heads is None else self._heads.get(run_id)

    def _remember(self, run_id: str, head: RunHead) -> None:
        """Cache `head` (of committed rows), unless the cache holds a newer head of the same registration."""
        if self._heads is None:
            return
        known = self._heads.get(run_id)
        if known is None or known.incarnation != head.incarnation or known.last_no <= head.last_no:
            self._heads.put(run_id, head)

    # --- 1. before the transaction ---

    async def _prepare(self, snapshots: Sequence[ContinuableSnapshot], *, refresh: str | None) -> _Prepared:
        """Plan and pack the rows `snapshots` add, from the runs' heads (`refresh`: re-read that run's head)."""
        run_ids = dict.fromkeys(snapshot.run_id for snapshot in snapshots)
        store = self._media.store
        if store is None:
            prepared = _Prepared(packs_inline=True)
            for run_id in run_ids:
                head = self._cached(run_id)
                if head is not None:
                    prepared.heads[run_id] = head.copy()
            prepared.reserved = _planned(prepared.heads, snapshots, {})
            return prepared
        prepared = _Prepared()
        media = self._media
        if store is self._staged_media:
            prepared.staged = StagedBlobs(store)
            media = MessageMedia(store=prepared.staged, threshold_bytes=media.threshold_bytes)
        for run_id in run_ids:
            head = None if run_id == refresh else self._cached(run_id)
            if head is None:
                head = await self._read_head(run_id)
            if head is not None:  # an unknown run: the transaction raises LookupError
                prepared.heads[run_id] = head.copy()
        new: dict[str, EncodedMessage] = {}
        prepared.reserved = _planned(prepared.heads, snapshots, new)
        for digest, message in new.items():
            if _has_no_media(message, media.threshold_bytes):
                prepared.packed[digest] = PackedMessage(message.data, externalized=False)
            else:
                prepared.packed[digest] = await media.pack_message(message)
        return prepared

    async def _read_head(self, run_id: str) -> RunHead | None:
        """The run's committed head, read from the database (and cached); `None` for an unknown run."""

        def read(transaction: Transaction) -> RunHead | None:
            row = transaction.execute(_RUN_ROW, {RUN_KEY: run_id}).first()
            if row is None:
                return None
            _require_counters(run_id, row.id, row.last_message_no)
            head = RunHead(incarnation=row.id)
            _catch_up(transaction, run_id, head, row.last_message_no)
            return head

        head = await self._db.run(read, write=False)
        if head is not None:
            self._remember(run_id, head.copy())
        return head

    # --- 2. inside the transaction ---

    def _write(self, transaction: Transaction, batch: StepWrites, prepared: _Prepared) -> None:
        if prepared.staged is not None:
            self._blobs.write(transaction, prepared.staged.rows)  # before the messages that refer to them
        for effect in batch.tool_effects:
            self._writes.record_tool_effect(transaction, effect)
        self._writes.append_events(transaction, batch.events)
        for snapshot, reserved in zip(batch.snapshots, prepared.reserved, strict=True):
            self._save(transaction, snapshot, prepared, reserved)

    def _save(
        self, transaction: Transaction, snapshot: ContinuableSnapshot, prepared: _Prepared, reserved: int
    ) -> None:
        allocation = self._allocate(transaction, snapshot, reserved)
        if allocation is None:
            return  # the run used this idempotency key already
        history = self._write_messages(transaction, snapshot, prepared, allocation, reserved)
        values = rows.snapshot_values(snapshot, seq=allocation.seq, history=history)
        transaction.execute(self._statements.insert_snapshot, values)
        if self._max_snapshots is not None:
            self._prune(transaction, snapshot.run_id, self._max_snapshots)

    def _allocate(self, transaction: Transaction, snapshot: ContinuableSnapshot, reserved: int) -> _Allocation | None:
        """Take the snapshot's sequence number and `reserved` message numbers; `None` if its key was used.

        Raises `LookupError` for an unregistered run.
        """
        run_id = snapshot.run_id
        parameters = {RUN_KEY: run_id, 'added': reserved}
        claim_and_allocate = self._statements.claim_and_allocate_snapshot
        if snapshot.idempotency_key is None:
            allocated = transaction.execute(self._statements.allocate_snapshot, parameters).first()
        elif claim_and_allocate is not None:
            parameters['idempotency_key'] = snapshot.idempotency_key
            allocated = transaction.execute(claim_and_allocate, parameters).first()
            if allocated is None:
                require_run(transaction, run_id)
                return None
        elif self._claim_key(transaction, snapshot):
            allocated = transaction.execute(self._statements.allocate_snapshot, parameters).first()
        else:
            return None
        if allocated is None:
            raise LookupError(f'run {run_id!r} is not registered')
        run_pk, seq, last_message_no = allocated
        _require_counters(run_id, run_pk, seq, last_message_no)
        return _Allocation(run_pk=run_pk, seq=seq, after=last_message_no - reserved)

    def _claim_key(self, transaction: Transaction, snapshot: ContinuableSnapshot) -> bool:
        """Record the snapshot's idempotency key; `False` if the run already used it."""
        parameters = {RUN_KEY: snapshot.run_id, 'idempotency_key': snapshot.idempotency_key}
        if transaction.execute(self._statements.claim_snapshot_key, parameters).rowcount:
            return True
        require_run(transaction, snapshot.run_id)
        return False

    def _write_messages(
        self,
        transaction: Transaction,
        snapshot: ContinuableSnapshot,
        prepared: _Prepared,
        allocation: _Allocation,
        reserved: int,
    ) -> StoredHistory:
        """Write the changed positions of the snapshot's history, numbered after `allocation.after`, and
        return the snapshot's reference to its history.

        The allocation set the run's `last_message_no` to `allocation.after + reserved`; it is
        corrected here if the rows written differ.
        """
        run_id, after = snapshot.run_id, allocation.after
        head = prepared.heads.get(run_id)
        if head is None or head.incarnation != allocation.run_pk or head.last_no > after:
            head = prepared.heads[run_id] = RunHead(incarnation=allocation.run_pk)
        if head.last_no < after:
            _catch_up(transaction, run_id, head, after)
        encoded = snapshot.encoded_messages()
        plan = plan_saves(head, [[message.digest for message in encoded]])
        if plan.rows:
            values = []
            for row in plan.rows:
                packed = prepared.body(run_id, encoded[row.position])
                values.append(
                    {
                        'run_id': run_id,
                        'no': row.no,
                        'position': row.position,
                        'digest': row.digest,
                        'body': packed.data,
                        'externalized': packed.externalized,
                    }
                )
            transaction.execute(self._statements.insert_messages, values)
        through = plan.throughs[0]
        if through != after + reserved:
            transaction.execute(self._statements.advance_messages, {'pk': allocation.run_pk, 'last_no': through})
        head.advance(plan.rows, through=through)
        return StoredHistory(length=len(encoded), through_message=through)

    def _prune(self, transaction: Transaction, run_id: str, max_snapshots: int) -> None:
        found = transaction.execute(self._statements.snapshot_states, {RUN_KEY: run_id})
        stored: list[tuple[int, SnapshotState]] = [(seq, state) for seq, state in found]
        keep = set(retained_seqs(stored, max_snapshots))
        pruned = [seq for seq, _ in stored if seq not in keep]
        if pruned:
            transaction.execute(self._statements.prune_snapshots, {RUN_KEY: run_id, 'seqs': pruned})


def _catch_up(transaction: Transaction, run_id: str, head: RunHead, through: int) -> None:
    """Advance `head` with the run's rows numbered after it, up to `through`.

    A row damaged behind the store's back (SQLite keeps any value in any column) changes nothing
    but its own position: a number that is not an integer drops the row, a position that is not one
    (or one the row cannot hold, which `RunHead.apply` logs) or a digest that is not text makes the
    position be written again.
    """
    found = rows.fetch(transaction, _ROWS_SINCE, {RUN_KEY: run_id, 'after': head.last_no, 'through': through})
    head.apply(
        (
            (no, position if _is_int(position) else None, digest if isinstance(digest, str) else None)
            for no, position, digest in found
            if _is_int(no)
        ),
        through=through,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_counters(run_id: str, run_pk: object, *counters: object) -> None:
    """Raise `ValueError` unless the run row's key is an integer and its counters are integers from 0 (a
    damaged row: SQLite keeps any value in any column)."""
    if not (_is_int(run_pk) and all(_is_int(counter) and counter >= 0 for counter in counters)):  # type: ignore[operator]
        raise ValueError(f'run {run_id!r} is damaged: its row holds {(run_pk, *counters)!r} as its key and counters')


def _planned(
    heads: dict[str, RunHead], snapshots: Sequence[ContinuableSnapshot], new: dict[str, EncodedMessage]
) -> list[int]:
    """Per snapshot, how many message rows its save adds after the previous ones, planned from copies of
    `heads` (0 for a run without a head); the messages of those rows are added to `new` by digest."""
    planned = {run_id: head.copy() for run_id, head in heads.items()}
    reserved: list[int] = []
    for snapshot in snapshots:
        head = planned.get(snapshot.run_id)
        if head is None:
            reserved.append(0)
            continue
        encoded = snapshot.encoded_messages()
        plan = plan_saves(head, [[message.digest for message in encoded]])
        for row in plan.rows:
            new.setdefault(row.digest, encoded[row.position])
        head.advance(plan.rows, through=plan.throughs[0])
        reserved.append(len(plan.rows))
    return reserved


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
