"""Applying one run's writes: tool effects, then events, then snapshots, in a few round trips.

Every write of `MongoStepStore` goes through `RunWriter.apply`, a single call being a batch of
one. There are no transactions (a standalone server must work), so a batch is made to have
exactly the effect of its calls in order by construction:

1. Everything is checked first: every document against the 16 MiB limit, and the messages the
   snapshots need are packed (payloads moved to the media store). A failure here writes nothing.
2. One `$inc` on the run's counters document allocates every event and snapshot number at once
   and proves the run is registered (a batch of tool effects alone checks the run once per store).
   A run that is not stored is registered bare first (`stores/_bare.py`: its document, then its
   counters; a concurrent first write that inserted the document first wins, and its counters are
   made by whichever allocation needs them first).
3. Then one ordered `bulk_write` of tool-effect upserts, one `insert_many` of events, one of
   message documents (plus a `lines` document and one more only when another writer appended to
   the line meanwhile: the save branches, `_histories.py`), one of snapshots, and retention once
   for the batch (the kept set is the same as after each save).

Within a batch, a repeated idempotency key is dropped before writing (the later call would be a
no-op), so unordered inserts cannot reorder which one lands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from pymongo import UpdateOne
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
from step_persistence.stores.mongo._histories import HistoryWrite
from step_persistence.stores.mongo._indexes import TOOL_CALL_INDEX, is_duplicate_on, is_idempotency_conflict
from step_persistence.stores.mongo._known_runs import KnownRuns
from step_persistence.stores.mongo._limits import WIDEST_NUMBER, check_document_size
from step_persistence.stores.mongo._lines import LineBases
from step_persistence.stores.mongo._messages import MessageStore
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
        self._runs = database['runs']
        self._events = database['events']
        self._snapshots = database['snapshots']
        self._effects = database['tool_effects']
        self._counters = counters
        self._messages = messages
        self._bases = bases
        self._heads = heads
        self._known_runs = known_runs
        self._max_snapshots = max_snapshots_per_run

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

        first = first_write(writes.tool_effects, writes.events, writes.snapshots)
        increments = {name: count for name, count in (('event', len(events)), ('snapshot', len(snapshots))) if count}
        if increments:
            try:
                allocation: Allocation | None = await self._counters.allocate(run_id, **increments)
            except LookupError:
                await self._register_bare(first)
                allocation = await self._counters.allocate(run_id, **increments)
            self._known_runs.add(run_id)
        else:
            allocation = None
            await self._require_run(first)

        await self._upsert_effects(effect_updates)
        if allocation is not None and events:
            first_seq = allocation.last['event'] - len(events) + 1
            await _insert_keyed(
                self._events, [event_document(event, seq=first_seq + index) for index, event in enumerate(events)]
            )
        if allocation is not None and head is not None:
            await self._save_snapshots(run_id, snapshots, histories, head, allocation)

    def _effect_update(self, record: ToolEffectRecord) -> UpdateOne:
        fields = tool_effect_update(record)
        check_document_size(fields, what=f'tool effect {record.tool_call_id!r}', run_id=record.run_id)
        key = {'run_id': record.run_id, 'tool_call_id': record.tool_call_id}
        return UpdateOne(key, {'$set': fields}, upsert=True)

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

    async def _upsert_effects(self, updates: list[UpdateOne]) -> None:
        """Apply the upserts in order; one that lost an insert race to a concurrent upsert is retried once."""
        if not updates:
            return
        try:
            await self._effects.bulk_write(updates, ordered=True)
        except BulkWriteError as error:
            failures = error.details.get('writeErrors', [])
            if (
                error.details.get('writeConcernErrors')
                or not failures
                or not is_duplicate_on(failures[0], TOOL_CALL_INDEX, ('run_id', 'tool_call_id'))
            ):
                raise
            await self._effects.bulk_write(updates[failures[0]['index'] :], ordered=True)

    async def _save_snapshots(
        self,
        run_id: str,
        snapshots: list[ContinuableSnapshot],
        histories: HistoryWrite,
        head: RunHead,
        allocation: Allocation,
    ) -> None:
        if head.incarnation is None:
            head.incarnation = allocation.registration
        elif head.incarnation != allocation.registration:
            # The run was deleted and registered again since this head was read (by another store).
            head = await self._heads.read(run_id, histories.digests[0])
            head.incarnation = allocation.registration
        views, head = await histories.write(head)
        first = allocation.last['snapshot'] - len(snapshots) + 1
        documents = [
            snapshot_document(
                snapshot,
                seq=first + index,
                view=StoredView(
                    line=view.line, length=len(digests), through=view.through, history_digest=history_digest(digests)
                ),
            )
            for index, (snapshot, view, digests) in enumerate(zip(snapshots, views, histories.digests, strict=True))
        ]
        inserted = await _insert_keyed(self._snapshots, documents)
        if inserted == len(documents):
            self._known_runs.remember(run_id, head)
        else:  # a replayed key: the head's view is not a stored snapshot's, so the next save reads one
            self._known_runs.forget_head(run_id)
        if inserted and self._max_snapshots is not None:
            await self._prune(run_id, self._max_snapshots)

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
