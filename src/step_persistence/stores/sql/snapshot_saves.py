"""Saving snapshots: the one place that plans, packs, numbers and writes a snapshot's message rows.

A snapshot's history is stored in the line model of `stores/_positions.py`: a `messages` row
(`line_id`, `no`, `position`, `digest`, `body`) only for each position whose message differs from
the view the save builds on, and the snapshot row names its own view with `line_id`,
`history_length` and `through_message` (plus its `history_digest`, for `find_snapshot`). What the
store knows of the view a run's next save builds on is its head (`heads.py`: a `RunHead` and its
anchor, the stored snapshot whose view it is), whose incarnation is `runs.id` (never reused, so a
head from before the run was deleted and registered again is never used). The heads of recently
written runs are cached (`BoundedLru`), except in a caller's transaction, which may still roll back;
a run registered with an origin starts from the head of the origin's run when that head is the
origin snapshot's view (the previous turn of a chat, saved by this store).

One `write_batch` (a flush: tool effects, events and snapshots), in order:

1. Before any transaction (`_prepare`): each run's head comes from the cache, or from a read
   transaction of its own (`heads.read_head`: the view of the run's newest snapshot, else of its
   origin snapshot, whose message rows are not read when its stored `history_digest` shows that
   the history being saved starts with that view; a run not stored yet has none). `plan_saves`
   finds the rows each snapshot adds; those messages are packed through the media policy. Blobs
   bound for this database's `SqlMediaStore` are staged (`StagedBlobs`) for the transaction; blobs
   for any other media store are stored now. With `media_store=None` a message is its own bytes: a
   head that is not cached is read inside the transaction, and the rows are packed there.
2. One write transaction (`_write`; on SQLite `BEGIN IMMEDIATE`): the staged blob rows, the tool
   effects and events (`writes.py`), then per snapshot, in order (`_save`):
   a. the snapshot's idempotency key, if any, is claimed (a key the run used already ends the
      save: the run has that snapshot); then one `UPDATE runs ... RETURNING` (on PostgreSQL the
      same statement as the claim) takes the run's next `last_snapshot_seq`. It holds the run's
      row until commit, so writers of one run, in any process, take turns here. A run not stored
      is registered bare (`writes.py`) and both taken again;
   b. the head must belong to this registration of the run and its anchor must still be stored
      (`heads.anchor_exists`: on PostgreSQL the anchor's row is locked `FOR KEY SHARE`, so a delete
      of it waits for this commit, and finds the rows in use); otherwise the head is read again,
      and should that need messages that were not packed in step 1, `NeedsPacking` rolls the
      whole transaction back;
   c. the rows are placed (`_place`): appended to the head's line when the line's
      `last_message_no` is still the head's `through` (one `UPDATE ... WHERE last_message_no =`,
      atomic with taking the numbers), else in a new line (a branch, whose base is the part of the
      head's view the history keeps: another writer appended to the line since), numbered from 1
      there; then inserted in one statement;
   d. the snapshot row is inserted, and with `max_snapshots_per_run` the run's snapshots that
      retention no longer keeps (`retained_seqs`) are deleted.
   On PostgreSQL, a, b and c (taking the numbers on the head's line) are one statement
   (`WriteStatements.allocate_on_line`), planned from the prepared head; only a head it finds
   stale takes the separate statements of b and c.
3. After `NeedsPacking`, the run's head is read again and both steps run again. After the commit,
   the heads (each now the view of the snapshot just written) go to the cache.

On PostgreSQL a flush of one run (its tool effects, events and at most one snapshot, without blob
rows) skips step 2 when it can: planned from the prepared head, it is one statement
(`flush_statement.py`) doing a to d, in autocommit on an engine (one round trip, no `BEGIN` or
`COMMIT`). That statement writes everything or nothing; when its checks fail (a run not stored, a
key used already, a head that is stale) it writes nothing, and step 2 writes the flush.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError

from step_persistence._history import EncodedMessage, history_digest
from step_persistence._lru import BoundedLru
from step_persistence.media.protocol import MediaStore
from step_persistence.media.walker import MARKER_KEY
from step_persistence.records import ContinuableSnapshot, RunRecord, SnapshotState, StepWrites
from step_persistence.retention import retained_seqs
from step_persistence.stores._media import MessageMedia, PackedMessage
from step_persistence.stores._positions import LineBase, NumberedRow, RunHead, SavePlan, plan_saves
from step_persistence.stores.sql import flush_statement, rows
from step_persistence.stores.sql.blobs import BlobWriter, StagedBlobs
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.heads import Anchor, KnownHead, anchor_exists, read_head, require_key
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.rows import RUN_KEY, StoredHistory
from step_persistence.stores.sql.statements import WriteStatements
from step_persistence.stores.sql.writes import Writes

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = ['HEADS_CACHED', 'NeedsPacking', 'SnapshotSaves']

_FOREIGN_KEY_VIOLATION = '23503'

HEADS_CACHED = 256
"""How many runs' heads a store keeps in memory (the least recently used is forgotten)."""


class NeedsPacking(Exception):
    """A message the transaction must write was not packed beforehand: refresh the run's head and retry."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f'run {run_id!r} changed while its snapshot was being prepared')
        self.run_id = run_id


@dataclass
class _Prepared:
    """What one write operation prepared for its snapshots before its transaction."""

    heads: dict[str, KnownHead] = field(default_factory=dict[str, KnownHead])
    """Per run, the head the transaction starts from (a copy), replaced as it writes."""
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
    confirmed: bool = False
    """Whether the allocating statement found the head of this registration with its anchor stored."""
    taken: bool | None = None
    """Whether it also took the line's numbers for the plan (`None`: it did not try)."""


@dataclass(frozen=True, slots=True)
class _Flushed:
    """What a flush written in one statement leaves: its run, and the run's new head if it saved a snapshot."""

    run_id: str
    known: KnownHead | None = None
    prune_again: bool = False
    """Whether retention must be applied again (a save committed while the statement ran)."""


@dataclass(frozen=True, slots=True)
class _OneStatement:
    """A flush as one statement (`FLUSH_EVENTS`, or `FLUSH_SNAPSHOT` with the snapshot's history `digests`)."""

    statement: Prepared
    parameters: dict[str, Any]
    digests: list[str] | None = None

    def flushed(self, row: Sequence[Any] | None) -> _Flushed | None:
        """What the statement's row says it wrote (`None`: nothing, its checks failed)."""
        run_id: str = self.parameters[RUN_KEY]
        if self.digests is None:
            return None if row is None or row[0] is None else _Flushed(run_id)
        outcome = flush_statement.Outcome.of(row)
        if outcome.run_pk is None:
            return None
        seq, through = outcome.seq, outcome.through
        if not (_is_count(seq) and _is_count(through)):
            raise ValueError(f'run {run_id!r} is damaged: its row holds {seq!r} as its snapshot counter')
        saved = RunHead(incarnation=outcome.run_pk, line=outcome.line, last_no=through, latest=list(self.digests))
        known = KnownHead(saved, Anchor(run_id=run_id, seq=seq), checked=True)
        return _Flushed(run_id, known, prune_again=outcome.saw_concurrent_save)


def _is_count(value: object) -> TypeIs[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
        self._heads: BoundedLru[str, KnownHead] | None = BoundedLru(HEADS_CACHED) if cache_heads else None
        self._max_snapshots = max_snapshots
        self._blobs = BlobWriter(database.dialect_name)

    async def write_batch(self, batch: StepWrites) -> None:
        """Tool effects, then events, then snapshots, each in list order, in one transaction (on PostgreSQL,
        a flush of one run in one statement when it can: `flush_statement.py`)."""
        refresh: str | None = None
        while True:
            prepared = await self._prepare(batch.snapshots, refresh=refresh)
            flush = self._in_one_statement(batch, prepared)
            if flush is not None:
                flushed = await self._flush_in_one_statement(flush)
                if flushed is not None:
                    if flushed.known is not None:
                        self._remember(flushed.run_id, flushed.known)
                    if flushed.prune_again and self._max_snapshots is not None:
                        prune = partial(self._prune, run_id=flushed.run_id, max_snapshots=self._max_snapshots)
                        await self._db.run(prune, write=True)
                    return
            try:
                await self._db.run(partial(self._write, batch=batch, prepared=prepared), write=True)
            except NeedsPacking as stale:
                refresh = stale.run_id
                continue
            for run_id, known in prepared.heads.items():
                self._remember(run_id, known)
            return

    def registered(self, record: RunRecord, run_pk: int) -> None:
        """Remember the head of a run just registered (committed): none, or its origin snapshot's view when
        this store's cached head of the origin's run is that view."""
        origin = record.origin
        if origin is None:
            self._remember(record.run_id, KnownHead(RunHead(incarnation=run_pk)))
            return
        source = self._cached(origin.run_id)
        if source is not None and source.anchor == Anchor(run_id=origin.run_id, seq=origin.seq):
            head = source.head
            own = RunHead(incarnation=run_pk, line=head.line, last_no=head.last_no, latest=list(head.latest))
            self._remember(record.run_id, KnownHead(own, source.anchor))

    def forget(self, run_id: str) -> None:
        """Drop the head of a run just deleted, or just filled in from bare (read again at its next save)."""
        if self._heads is not None:
            self._heads.pop(run_id)

    def _cached(self, run_id: str) -> KnownHead | None:
        return None if self._heads is None else self._heads.get(run_id)

    def _remember(self, run_id: str, known: KnownHead) -> None:
        """Cache `known` (of committed rows), unless the cache holds a head of a newer snapshot of the same
        registration."""
        if self._heads is None:
            return
        cached = self._heads.get(run_id)
        if (
            cached is None
            or cached.head.incarnation != known.head.incarnation
            or _order(run_id, cached) <= _order(run_id, known)
        ):
            self._heads.put(run_id, known.copy())

    # --- 1. before the transaction ---

    async def _prepare(self, snapshots: Sequence[ContinuableSnapshot], *, refresh: str | None) -> _Prepared:
        """Plan and pack the rows `snapshots` add, from the runs' heads (`refresh`: re-read that run's head)."""
        firsts: dict[str, list[str]] = {}
        for snapshot in snapshots:
            firsts.setdefault(snapshot.run_id, _digests(snapshot))
        store = self._media.store
        if store is None:
            prepared = _Prepared(packs_inline=True)
            for run_id in firsts:
                known = None if run_id == refresh else self._cached(run_id)
                if known is not None:
                    prepared.heads[run_id] = known.copy()
            return prepared
        prepared = _Prepared()
        media = self._media
        if store is self._staged_media:
            prepared.staged = StagedBlobs(store)
            media = MessageMedia(store=prepared.staged, threshold_bytes=media.threshold_bytes)
        for run_id, digests in firsts.items():
            known = None if run_id == refresh else self._cached(run_id)
            if known is None:
                known = await self._read_head(run_id, digests)
            # A run not stored: its first save (`_allocate` registers it bare) starts from no view.
            prepared.heads[run_id] = KnownHead(RunHead(incarnation=None)) if known is None else known.copy()
        for digest, message in _new_messages(prepared.heads, snapshots).items():
            if _has_no_media(message, media.threshold_bytes):
                prepared.packed[digest] = PackedMessage(message.data, externalized=False)
            else:
                prepared.packed[digest] = await media.pack_message(message)
        return prepared

    async def _read_head(self, run_id: str, digests: Sequence[str]) -> KnownHead | None:
        """The run's head as stored (and cached); `None` for an unknown run."""
        known = await self._db.run(partial(read_head, run_id=run_id, digests=digests, lock=False), write=False)
        if known is not None:
            self._remember(run_id, known)
        return known

    # --- 2. in one statement (PostgreSQL) ---

    def _in_one_statement(self, batch: StepWrites, prepared: _Prepared) -> _OneStatement | None:
        """The flush as one statement (`flush_statement.py`), when it is the writes of one run with at most one
        snapshot, no blob rows and no two records of one tool call; else `None` (the transaction writes it)."""
        statements = self._statements
        if statements.flush_events is None or statements.flush_snapshot is None or len(batch.snapshots) > 1:
            return None
        if prepared.staged is not None and prepared.staged.rows:
            return None
        runs = {effect.run_id for effect in batch.tool_effects} | {event.run_id for event in batch.events}
        runs.update(snapshot.run_id for snapshot in batch.snapshots)
        calls = {effect.tool_call_id for effect in batch.tool_effects}
        if len(runs) != 1 or len(calls) != len(batch.tool_effects):
            return None
        (run_id,) = runs
        parameters: dict[str, Any] = {RUN_KEY: run_id}
        parameters |= flush_statement.events_parameters(batch.tool_effects, batch.events)
        if not batch.snapshots:
            return _OneStatement(statements.flush_events, parameters)
        snapshot = batch.snapshots[0]
        known = prepared.heads.get(run_id)
        if known is None or known.head.incarnation is None or (known.head.line is not None and known.anchor is None):
            return None
        encoded = snapshot.encoded_messages()
        digests = [message.digest for message in encoded]
        head = known.head
        plan = plan_saves(head, [digests])
        if head.last_no + len(plan.rows) not in rows.SEQ_RANGE:
            return None  # a damaged `through`: numbers past BIGINT, which only a branch (renumbered) can take
        try:
            bodies = [prepared.body(run_id, encoded[row.position]) for row in plan.rows]
        except NeedsPacking:
            return None
        base = _kept_base(head, plan, len(digests))
        parameters |= flush_statement.snapshot_parameters(snapshot)
        parameters |= flush_statement.message_parameters(plan.rows, bodies)
        parameters.update(
            incarnation=head.incarnation,
            anchor_run=None if known.anchor is None else known.anchor.run_id,
            anchor_seq=None if known.anchor is None else known.anchor.seq,
            line=_line_of(head),
            through=head.last_no,
            added=len(plan.rows),
            branch_line=None if base is None else base.line,
            branch_length=None if base is None else base.length,
            branch_through=None if base is None else base.through,
            snapshot_length=len(digests),
            snapshot_digest=history_digest(digests),
            keep_older=None if self._max_snapshots is None else self._max_snapshots - 1,
        )
        return _OneStatement(statements.flush_snapshot, parameters, digests)

    async def _flush_in_one_statement(self, flush: _OneStatement) -> _Flushed | None:
        """Run the statement: in autocommit on an engine; in a caller's transaction, as one of its statements
        (on a caller's asyncpg connection, in a savepoint of it). `None`: it wrote nothing.

        In autocommit, a run deleted by another writer between the statement's checks and its writes fails
        it with a foreign-key violation, which rolled the statement back whole: the transaction then writes
        the flush (registering the run bare, as any write to a run not stored).
        """
        autocommit = not self._db.in_caller_transaction
        try:
            row = await self._db.run_statement(flush.statement, flush.parameters, autocommit=autocommit)
        except IntegrityError as error:
            if autocommit and getattr(error.orig, 'sqlstate', None) == _FOREIGN_KEY_VIOLATION:
                return None
            raise
        return flush.flushed(row)

    # --- 3. inside the transaction ---

    def _write(self, transaction: Transaction, batch: StepWrites, prepared: _Prepared) -> None:
        if prepared.staged is not None:
            self._blobs.write(transaction, prepared.staged.rows)  # before the messages that refer to them
        for effect in batch.tool_effects:
            self._writes.record_tool_effect(transaction, effect)
        self._writes.append_events(transaction, batch.events)
        for snapshot in batch.snapshots:
            self._save(transaction, snapshot, prepared)

    def _save(self, transaction: Transaction, snapshot: ContinuableSnapshot, prepared: _Prepared) -> None:
        run_id = snapshot.run_id
        encoded = snapshot.encoded_messages()
        digests = [message.digest for message in encoded]
        known = prepared.heads.get(run_id)
        plan = None if known is None else plan_saves(known.head, [digests])
        allocation = self._allocate(transaction, snapshot, known, plan)
        if allocation is None:
            return  # the run used this idempotency key already
        if known is None or plan is None or not allocation.confirmed:
            known = self._anchored(transaction, run_id, allocation.run_pk, digests, prepared)
            plan = plan_saves(known.head, [digests])
        line, placed, through = self._place(transaction, known.head, plan, len(digests), taken=allocation.taken)
        if placed:
            values = []
            for row in placed:
                packed = prepared.body(run_id, encoded[row.position])
                values.append(
                    {
                        'line_id': line,
                        'no': row.no,
                        'position': row.position,
                        'digest': row.digest,
                        'body': packed.data,
                        'externalized': packed.externalized,
                    }
                )
            transaction.execute(self._statements.insert_messages, values)
        history = StoredHistory(
            line=line, length=len(digests), through_message=through, history_digest=history_digest(digests)
        )
        header = rows.snapshot_values(snapshot, seq=allocation.seq, history=history)
        transaction.execute(self._statements.insert_snapshot, header)
        saved = RunHead(incarnation=allocation.run_pk, line=line, last_no=through, latest=list(digests))
        prepared.heads[run_id] = KnownHead(saved, Anchor(run_id=run_id, seq=allocation.seq), checked=True)
        if self._max_snapshots is not None:
            self._prune(transaction, run_id, self._max_snapshots)

    def _allocate(
        self, transaction: Transaction, snapshot: ContinuableSnapshot, known: KnownHead | None, plan: SavePlan | None
    ) -> _Allocation | None:
        """Take the snapshot's sequence number; `None` if its key was used.

        Where the dialect can (`WriteStatements.allocate_on_line`), the same statement checks the head
        `known` and takes the line's numbers for `plan`: the allocation says whether it did. A run
        that is not stored is registered bare (`Writes.register_bare`), and the number taken again.
        """
        run_id = snapshot.run_id
        allocated = self._take(transaction, snapshot, known, plan)
        if allocated is None:
            self._writes.register_bare(transaction, snapshot)
            allocated = self._take(transaction, snapshot, None, None)
        if allocated is None:
            if snapshot.idempotency_key is not None:
                return None  # the run used this key already
            raise LookupError(f'run {run_id!r} was deleted while being written to')
        run_pk, seq, *checked = allocated
        if not _is_count(seq):
            raise ValueError(f'run {run_id!r} is damaged: its row holds {seq!r} as its snapshot counter')
        allocation = _Allocation(run_pk=require_key(run_id, run_pk), seq=seq)
        if checked and known is not None:
            anchored, taken = checked
            if run_pk == known.head.incarnation and anchored:
                known.checked = True
                return replace(allocation, confirmed=True, taken=bool(taken))
        return allocation

    def _take(
        self, transaction: Transaction, snapshot: ContinuableSnapshot, known: KnownHead | None, plan: SavePlan | None
    ) -> Any:
        """The row of the statements that claim the snapshot's key and take its number (see `_allocate`);
        `None` if the run used the key already or is not stored."""
        parameters: dict[str, object] = {RUN_KEY: snapshot.run_id}
        keyed = snapshot.idempotency_key is not None
        if keyed:
            parameters['idempotency_key'] = snapshot.idempotency_key
        on_line = self._statements.allocate_on_line
        anchor = None if known is None else known.anchor
        if on_line is not None and known is not None and plan is not None and anchor is not None:
            parameters.update(
                incarnation=known.head.incarnation,
                anchor_run=anchor.run_id,
                anchor_seq=anchor.seq,
                line=known.head.line,
                through=known.head.last_no,
                added=len(plan.rows),
            )
            return transaction.execute(on_line[keyed], parameters).first()
        if keyed and self._statements.claim_and_allocate_snapshot is not None:
            return transaction.execute(self._statements.claim_and_allocate_snapshot, parameters).first()
        if keyed and not self._claim_key(transaction, snapshot):
            return None
        return transaction.execute(self._statements.allocate_snapshot, parameters).first()

    def _claim_key(self, transaction: Transaction, snapshot: ContinuableSnapshot) -> bool:
        """Record the snapshot's idempotency key; `False` if the run already used it (or is not stored)."""
        parameters = {RUN_KEY: snapshot.run_id, 'idempotency_key': snapshot.idempotency_key}
        return bool(transaction.execute(self._statements.claim_snapshot_key, parameters).rowcount)

    def _anchored(
        self, transaction: Transaction, run_id: str, run_pk: int, digests: Sequence[str], prepared: _Prepared
    ) -> KnownHead:
        """The run's head, of this registration and with its anchor stored (locked on PostgreSQL), or
        none for a head prepared before the run was stored.

        A head that is not (another writer deleted its snapshot, or the run and registered it again)
        is read again here when messages are packed inside the transaction; otherwise `NeedsPacking`.
        """
        known = prepared.heads.get(run_id)
        if known is not None and known.head.incarnation is None and known.anchor is None:
            # Prepared for a run that was not stored: no view to build on, whatever the run holds now.
            known.head.incarnation = run_pk
            known.checked = True
            return known
        if (
            known is not None
            and known.head.incarnation == run_pk
            and (known.anchor is None or known.checked or anchor_exists(transaction, known.anchor))
        ):
            known.checked = True
            return known
        if not prepared.packs_inline:
            raise NeedsPacking(run_id)
        found = read_head(transaction, run_id, digests, lock=True)
        if found is None:
            raise LookupError(f'run {run_id!r} was deleted while being written to')
        prepared.heads[run_id] = found
        return found

    def _place(
        self, transaction: Transaction, head: RunHead, plan: SavePlan, length: int, *, taken: bool | None
    ) -> tuple[int | None, list[NumberedRow], int]:
        """Where the planned rows go: `(line, rows, through)` of the saved view.

        On the head's line when nobody appended to it since the head's view (`taken`: whether the
        allocation already took the numbers there; `None`: take them here); else on a new line
        (branching from the part of the head's view the history keeps, if any), its rows numbered
        from 1. A plan without rows keeps the head's view (the history is a prefix of it).
        """
        current = _line_of(head)
        if not plan.rows:
            return current, [], head.last_no
        if current is not None:
            if taken is None:
                appending = {'line': current, 'through': head.last_no, 'added': len(plan.rows)}
                taken = bool(transaction.execute(self._statements.append_to_line, appending).rowcount)
            if taken:
                return current, plan.rows, plan.throughs[0]
        base = _kept_base(head, plan, length)
        parameters: dict[str, object] = {
            'last_message_no': len(plan.rows),
            'base_line_id': None if base is None else base.line,
            'base_length': None if base is None else base.length,
            'base_through': None if base is None else base.through,
        }
        (line,) = transaction.execute(self._statements.insert_line, parameters).first()
        offset = head.last_no
        renumbered = [NumberedRow(row.no - offset, row.position, row.digest) for row in plan.rows]
        return line, renumbered, len(renumbered)

    def _prune(self, transaction: Transaction, run_id: str, max_snapshots: int) -> None:
        found = transaction.execute(self._statements.snapshot_states, {RUN_KEY: run_id})
        stored: list[tuple[int, SnapshotState]] = [(seq, state) for seq, state in found]
        keep = set(retained_seqs(stored, max_snapshots))
        pruned = [seq for seq, _ in stored if seq not in keep]
        if pruned:
            transaction.execute(self._statements.prune_snapshots, {RUN_KEY: run_id, 'seqs': pruned})


def _digests(snapshot: ContinuableSnapshot) -> list[str]:
    return [message.digest for message in snapshot.encoded_messages()]


def _line_of(head: RunHead) -> int | None:
    """The head's line as the SQL store numbers lines (`history_lines.id`)."""
    if head.line is None or isinstance(head.line, int):
        return head.line
    raise TypeError(f'a SQL history line is an integer, not {head.line!r}')


def _order(run_id: str, known: KnownHead) -> int:
    """How new the view of a head of `run_id` is: its anchor's seq when the anchor is the run's own snapshot."""
    anchor = known.anchor
    return anchor.seq if anchor is not None and anchor.run_id == run_id else 0


def _kept_base(head: RunHead, plan: SavePlan, length: int) -> LineBase | None:
    """The base of a line branching from `head` for a history of `length` saved by `plan`: the head's view
    up to its last position the history keeps (`None`: it keeps none)."""
    if head.line is None:
        return None
    changed = {row.position for row in plan.rows}
    kept = next(
        (position for position in reversed(range(min(length, len(head.latest)))) if position not in changed), None
    )
    return None if kept is None else LineBase(line=head.line, length=kept + 1, through=head.last_no)


def _new_messages(heads: dict[str, KnownHead], snapshots: Sequence[ContinuableSnapshot]) -> dict[str, EncodedMessage]:
    """The messages of the rows `snapshots` add (by digest), planned in order from copies of `heads` (a run
    without a head adds none)."""
    planned = {run_id: known.head.copy() for run_id, known in heads.items()}
    new: dict[str, EncodedMessage] = {}
    for snapshot in snapshots:
        head = planned.get(snapshot.run_id)
        if head is None:
            continue
        encoded = snapshot.encoded_messages()
        digests = [message.digest for message in encoded]
        plan = plan_saves(head, [digests])
        for row in plan.rows:
            new.setdefault(row.digest, encoded[row.position])
        planned[snapshot.run_id] = RunHead(
            incarnation=head.incarnation, line=head.line, last_no=plan.throughs[0], latest=list(digests)
        )
    return new


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
