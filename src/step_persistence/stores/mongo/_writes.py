"""Applying one run's writes: tool effects, then events, then snapshots, in one round trip when it can.

Every write of `MongoStepStore` goes through `RunWriter.apply`, a single call being a batch of
one. There are no transactions (a standalone server must work), so a batch is made to have
exactly the effect of its calls in order by construction:

1. Everything is checked first: every document against the 16 MiB limit, and the messages the
   snapshots need are packed (payloads moved to the media store). A failure here writes nothing.
2. Numbers: the batch's event and snapshot numbers come from the run's counters document
   (`_counters.py`), which also proves the run is registered (a batch of tool effects alone
   checks the run once per store). When the server takes one ordered list of writes across
   collections (MongoDB 8.0+, `_ordered_writes.py`) and this store remembers the run's counters,
   the numbers are taken from memory and the list starts with the `claim` that moves the counters
   on only if they are still the remembered ones: if it fails, nothing of the list was applied,
   and the batch allocates as below and is sent again. Otherwise one `$inc` allocates every number
   first. A run that is not stored is registered bare then (`stores/_bare.py`: its document, then
   its counters; a concurrent first write that inserted the document first wins, and its counters
   are made by whichever allocation needs them first).
3. Then one ordered list: the tool-effect upserts, the events, the message documents of the
   histories on the run's line (`_histories.py`), the snapshots. Sent as one client `bulkWrite`, or
   one write per collection on older servers. Where an operation fails, what follows it was not
   applied, so the batch goes on from there: an event or snapshot whose idempotency key is stored
   is skipped (the later call would be a no-op), an upsert that lost an insert race to a
   concurrent upsert is sent again once, and a message number another writer took makes the
   histories branch (`HistoryWrite.settle`), the snapshots then inserted on their own. Retention
   runs once for the batch (the kept set is the same as after each save).

Within a batch, a repeated idempotency key is dropped before writing (the later call would be a
no-op), so skipping cannot change which one lands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from step_persistence._history import history_digest
from step_persistence.records import ContinuableSnapshot, StepEvent, StepWrites, ToolEffectRecord
from step_persistence.retention import retained_seqs
from step_persistence.stores._bare import Write, first_write
from step_persistence.stores._idempotency import first_per_key
from step_persistence.stores._positions import RunHead
from step_persistence.stores.mongo._client import Database
from step_persistence.stores.mongo._counters import Allocation, Counters
from step_persistence.stores.mongo._documents import (
    StoredView,
    event_document,
    snapshot_document,
    tool_effect_update,
)
from step_persistence.stores.mongo._heads import RunHeads
from step_persistence.stores.mongo._histories import Attempt, HistoryWrite, SavedView
from step_persistence.stores.mongo._indexes import (
    LINE_NUMBER_INDEX,
    TOOL_CALL_INDEX,
    is_duplicate_on,
    is_idempotency_conflict,
)
from step_persistence.stores.mongo._known_runs import KnownRuns
from step_persistence.stores.mongo._limits import WIDEST_NUMBER, check_document_size
from step_persistence.stores.mongo._lines import LineBases
from step_persistence.stores.mongo._messages import MessageStore
from step_persistence.stores.mongo._ordered_writes import Insert, Operation, OrderedWrites, Update
from step_persistence.stores.mongo._runs import insert_bare_run

__all__ = ['RunWriter', 'RunWrites', 'by_run']

_WIDEST_VIEW: Final = StoredView(line='f' * 24, length=WIDEST_NUMBER, through=WIDEST_NUMBER, history_digest='f' * 64)
"""A view as wide as any a snapshot document names, for measuring one before its view is known."""

_PRUNED: Final = {
    '$set': {'pruned': True},
    '$unset': {'state': '', 'line': '', 'history_length': '', 'through_message': '', 'history_digest': ''},
}
"""Turns a pruned snapshot that has an idempotency key into a tombstone that keeps the key used."""


@dataclass
class RunWrites:
    """The writes of one run in a batch, each kind in call order."""

    tool_effects: list[ToolEffectRecord] = field(default_factory=list[ToolEffectRecord])
    events: list[StepEvent] = field(default_factory=list[StepEvent])
    snapshots: list[ContinuableSnapshot] = field(default_factory=list[ContinuableSnapshot])


def by_run(writes: StepWrites) -> dict[str, RunWrites]:
    """`writes` split per run (in order of first appearance); each run's part keeps its call order."""
    runs: dict[str, RunWrites] = {}
    for effect in writes.tool_effects:
        runs.setdefault(effect.run_id, RunWrites()).tool_effects.append(effect)
    for event in writes.events:
        runs.setdefault(event.run_id, RunWrites()).events.append(event)
    for snapshot in writes.snapshots:
        runs.setdefault(snapshot.run_id, RunWrites()).snapshots.append(snapshot)
    return runs


async def _insert_keyed(collection: AsyncCollection[dict[str, Any]], documents: list[dict[str, Any]]) -> int:
    """Insert documents that may repeat a stored idempotency key (those are skipped); return how many landed."""
    if not documents:
        return 0
    try:
        await collection.insert_many(documents, ordered=False)
    except BulkWriteError as error:
        failures = error.details.get('writeErrors', [])
        if error.details.get('writeConcernErrors') or not all(map(is_idempotency_conflict, failures)):
            raise
        return len(documents) - len(failures)
    return len(documents)


_TOOL_CALL: Final = ('run_id', 'tool_call_id')
_LINE_NO: Final = ('line', 'no')


def _snapshot_documents(
    snapshots: list[ContinuableSnapshot], histories: HistoryWrite, views: list[SavedView], allocation: Allocation
) -> list[dict[str, Any]]:
    """The snapshot documents, numbered from the allocation's, each naming its history's view."""
    first = allocation.last['snapshot'] - len(snapshots) + 1
    return [
        snapshot_document(
            snapshot,
            seq=first + index,
            view=StoredView(
                line=view.line, length=len(digests), through=view.through, history_digest=history_digest(digests)
            ),
        )
        for index, (snapshot, view, digests) in enumerate(zip(snapshots, views, histories.digests, strict=True))
    ]


@dataclass(frozen=True)
class _Batch:
    """One run's batch as an ordered list of operations, and where each kind starts in it."""

    operations: list[Operation]
    events: int
    messages: int
    snapshots: int
    claimed: bool
    """Whether the list starts with a counters `claim`."""

    def kind(self, index: int) -> str:
        """Which part of the batch operation `index` belongs to."""
        if self.claimed and index == 0:
            return 'claim'
        if index < self.events:
            return 'effect'
        if index < self.messages:
            return 'event'
        return 'message' if index < self.snapshots else 'snapshot'


class RunWriter:
    """Applies `RunWrites` to one database (see the module docstring)."""

    def __init__(
        self,
        database: Database,
        *,
        counters: Counters,
        messages: MessageStore,
        bases: LineBases,
        heads: RunHeads,
        known_runs: KnownRuns,
        max_snapshots_per_run: int | None,
    ) -> None:
        self._database = database
        self._runs = database['runs']
        self._snapshots = database['snapshots']
        self._counters = counters
        self._messages = messages
        self._bases = bases
        self._heads = heads
        self._known_runs = known_runs
        self._max_snapshots = max_snapshots_per_run
        self._ordered: OrderedWrites | None = None

    async def ordered_writes(self) -> OrderedWrites:
        """How this writer sends its lists (the server is asked once)."""
        if self._ordered is None:
            self._ordered = await OrderedWrites.for_database(self._database)
        return self._ordered

    async def apply(self, run_id: str, writes: RunWrites) -> None:
        """Apply `writes` with the effect of `record_tool_effect`*, `append_event`*, `save_snapshot`* in order."""
        events = first_per_key(writes.events)
        snapshots = first_per_key(writes.snapshots)
        effect_updates = [self._effect_update(record) for record in writes.tool_effects]
        for event in events:
            check_document_size(event_document(event, seq=WIDEST_NUMBER), what='an event', run_id=run_id)
        for snapshot in snapshots:
            check_document_size(
                snapshot_document(snapshot, seq=WIDEST_NUMBER, view=_WIDEST_VIEW), what='a snapshot', run_id=run_id
            )
        histories = HistoryWrite(
            self._messages, self._bases, run_id, [snapshot.encoded_messages() for snapshot in snapshots]
        )
        head = await self._heads.head(run_id, histories.digests[0]) if snapshots else None
        if head is not None:
            await histories.prepare(head)
        ordered = await self.ordered_writes()

        first = first_write(writes.tool_effects, writes.events, writes.snapshots)
        increments = {name: count for name, count in (('event', len(events)), ('snapshot', len(snapshots))) if count}
        cached = self._counters.cached(run_id) if increments and ordered.client_bulk_write else None
        if cached is not None:
            allocation: Allocation | None = cached.after(increments)
        elif increments:
            allocation = await self._allocate(run_id, first, increments)
        else:
            allocation = None
            await self._require_run(first)
        attempt = None
        if head is not None and allocation is not None:
            attempt = await self._attempt(run_id, histories, head, allocation)
        while True:
            claim = self._counters.claim(run_id, cached, increments) if cached is not None else None
            batch = self._batch(claim, effect_updates, events, snapshots, histories, attempt, allocation)
            if await self._send(run_id, batch, allocation, snapshots, histories, attempt):
                return
            # The claim failed: the counters moved on (another store wrote) or are gone (the run was deleted).
            cached = None
            allocation = await self._allocate(run_id, first, increments)
            if attempt is not None and attempt.head.incarnation != allocation.registration:
                attempt = await self._attempt(run_id, histories, attempt.head, allocation)

    async def _allocate(self, run_id: str, first: Write, increments: dict[str, int]) -> Allocation:
        """Allocate the numbers with one `$inc`, registering the run bare first if it is not stored."""
        try:
            allocation = await self._counters.allocate(run_id, **increments)
        except LookupError:
            await self._register_bare(first)
            allocation = await self._counters.allocate(run_id, **increments)
        self._known_runs.add(run_id)
        return allocation

    async def _attempt(self, run_id: str, histories: HistoryWrite, head: RunHead, allocation: Allocation) -> Attempt:
        """The first try at the histories, on a head of the run's registration `allocation` names."""
        if head.incarnation is None:
            head.incarnation = allocation.registration
        elif head.incarnation != allocation.registration:
            # The run was deleted and registered again since this head was read (by another store).
            head = await self._heads.read(run_id, histories.digests[0])
            head.incarnation = allocation.registration
        return await histories.attempt(head)

    def _batch(
        self,
        claim: Update | None,
        effect_updates: list[Update],
        events: list[StepEvent],
        snapshots: list[ContinuableSnapshot],
        histories: HistoryWrite,
        attempt: Attempt | None,
        allocation: Allocation | None,
    ) -> _Batch:
        operations: list[Operation] = [claim] if claim is not None else []
        operations.extend(effect_updates)
        events_at = len(operations)
        if allocation is not None and events:
            first_seq = allocation.last['event'] - len(events) + 1
            operations.extend(
                Insert('events', event_document(event, seq=first_seq + index)) for index, event in enumerate(events)
            )
        messages_at = len(operations)
        if attempt is not None and allocation is not None:
            operations.extend(Insert('messages', document) for document in attempt.documents)
        snapshots_at = len(operations)
        if attempt is not None and allocation is not None:
            views, _ = histories.landed(attempt)
            documents = _snapshot_documents(snapshots, histories, views, allocation)
            operations.extend(Insert('snapshots', document) for document in documents)
        return _Batch(operations, events_at, messages_at, snapshots_at, claimed=claim is not None)

    async def _send(
        self,
        run_id: str,
        batch: _Batch,
        allocation: Allocation | None,
        snapshots: list[ContinuableSnapshot],
        histories: HistoryWrite,
        attempt: Attempt | None,
    ) -> bool:
        """Send the batch, going on past the failures the module docstring lists; `False` if its claim failed."""
        ordered = await self.ordered_writes()
        operations = batch.operations
        if batch.claimed:
            self._counters.forget(run_id)  # until the claim is known to have applied
        start = 0
        retried: set[int] = set()
        skipped = 0
        while start < len(operations):
            stopped = await ordered.send(operations[start:])
            index = len(operations) if stopped is None else start + stopped.index
            if batch.claimed and index > 0 and allocation is not None:
                self._counters.remember(run_id, allocation)
            if stopped is None:
                break
            kind, error = batch.kind(index), stopped.error
            if kind == 'claim':
                return False
            if kind == 'effect' and index not in retried and is_duplicate_on(error, TOOL_CALL_INDEX, _TOOL_CALL):
                retried.add(index)
                start = index
            elif kind in ('event', 'snapshot') and is_idempotency_conflict(error):
                skipped += kind == 'snapshot'
                start = index + 1
            elif kind == 'message' and attempt is not None and is_duplicate_on(error, LINE_NUMBER_INDEX, _LINE_NO):
                # Another writer appended to the line since the head: branch, then insert the snapshots.
                assert allocation is not None
                views, head = await histories.settle(attempt, index - batch.messages)
                documents = _snapshot_documents(snapshots, histories, views, allocation)
                inserted = await _insert_keyed(self._snapshots, documents)
                await self._after_snapshots(run_id, head, skipped=len(documents) - inserted, inserted=inserted)
                return True
            else:
                raise stopped.exception
        if attempt is not None:
            _, head = histories.landed(attempt)
            await self._after_snapshots(run_id, head, skipped=skipped, inserted=len(snapshots) - skipped)
        return True

    async def _after_snapshots(self, run_id: str, head: RunHead, *, skipped: int, inserted: int) -> None:
        """Remember the run's head (unless a replayed key was skipped: the head's view is then not a stored
        snapshot's, so the next save reads one), and apply retention."""
        if skipped:
            self._known_runs.forget_head(run_id)
        else:
            self._known_runs.remember(run_id, head)
        if inserted and self._max_snapshots is not None:
            await self._prune(run_id, self._max_snapshots)

    def _effect_update(self, record: ToolEffectRecord) -> Update:
        fields = tool_effect_update(record)
        check_document_size(fields, what=f'tool effect {record.tool_call_id!r}', run_id=record.run_id)
        key = {'run_id': record.run_id, 'tool_call_id': record.tool_call_id}
        return Update('tool_effects', key, {'$set': fields}, upsert=True)

    async def _require_run(self, first: Write) -> None:
        """Make sure the run of `first` (its first write in the batch) is stored, registering it bare if not."""
        run_id = first.run_id
        if self._known_runs.knows(run_id):
            return
        if await self._runs.find_one({'_id': run_id}, {'_id': 1}) is None:
            await self._register_bare(first)
        self._known_runs.add(run_id)

    async def _register_bare(self, first: Write) -> None:
        """Register the run of `first` bare, unless a concurrent write or registration stored it first."""
        registration = await self._counters.next_registration()
        if await insert_bare_run(self._runs, first, registration):
            await self._counters.start_run(first.run_id, registration)

    async def _prune(self, run_id: str, max_snapshots: int) -> None:
        """Drop snapshots retention does not keep, among those visible now (never one not yet written).

        A pruned snapshot with an idempotency key stays as a tombstone (no state, no history), so
        the key stays used.
        """
        live = [
            (document['seq'], document['state'])
            async for document in self._snapshots.find(
                {'run_id': run_id, 'seq': {'$type': 'number'}, 'state': {'$ne': None}}, {'seq': 1, 'state': 1}
            )
        ]
        keep = retained_seqs(live, max_snapshots)
        dropped = [seq for seq, _ in live if seq not in keep]
        if not dropped:
            return
        keyed = {'idempotency_key': {'$type': 'string'}}
        await self._snapshots.update_many({'run_id': run_id, 'seq': {'$in': dropped}, **keyed}, _PRUNED)
        await self._snapshots.delete_many({'run_id': run_id, 'seq': {'$in': dropped}, '$nor': [keyed]})
