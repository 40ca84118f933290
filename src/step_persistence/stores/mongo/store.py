"""`MongoStepStore`: the `StepStore` protocol on MongoDB, through an async driver (pymongo or motor).

Uniqueness is enforced by the server, never by reading first: a run is its `runs` document
(`_id` = run id), idempotency keys and tool calls have unique indexes, and every sequence number
comes from an atomic `$inc` on the run's `counters` document. No operation needs a transaction,
so a standalone server works as well as a replica set. See docs/mongo.md.
"""

from __future__ import annotations

from functools import partial
from types import TracebackType
from typing import Any, Final, Self

from pymongo import ASCENDING, DESCENDING
from pymongo.errors import DuplicateKeyError

from step_persistence._history import decode_messages, pack_refs, unpack_refs
from step_persistence._reading import read_or_skip
from step_persistence.media.protocol import MediaStore
from step_persistence.media.walker import DEFAULT_THRESHOLD_BYTES
from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.retention import retained_seqs, validate_max_snapshots
from step_persistence.stores._media import MediaSetting, MessageMedia
from step_persistence.stores.mongo._client import MongoClientLike, MongoConnection, upsert
from step_persistence.stores.mongo._counters import Counters
from step_persistence.stores.mongo._documents import (
    event_document,
    event_from_document,
    run_document,
    run_from_document,
    snapshot_document,
    snapshot_from_document,
    tool_effect_from_document,
    tool_effect_update,
)
from step_persistence.stores.mongo._indexes import STEP_INDEXES, IndexSetup, is_idempotency_conflict
from step_persistence.stores.mongo._known_runs import KnownRuns
from step_persistence.stores.mongo._limits import check_document_size
from step_persistence.stores.mongo._messages import LoadedMessages, MessageStore
from step_persistence.stores.mongo._ordering import RunOrder

__all__ = ['MongoStepStore']

_LATEST_PAGE: Final = 4
"""How many snapshot headers `latest_snapshot` reads at a time while skipping unreadable ones."""

_PRUNED: Final = {'$set': {'pruned': True}, '$unset': {'state': '', 'messages': ''}}
"""Turns a pruned snapshot that has an idempotency key into a tombstone that keeps the key used."""


class _StaleMessageNumbers(Exception):
    """The cached message numbers belong to an earlier run registered under the same run id."""


class MongoStepStore:
    """Runs, events, snapshots and tool effects in one MongoDB database.

    Give exactly one of `client` (a pymongo `AsyncMongoClient` or motor `AsyncIOMotorClient`
    the caller owns: never closed by the store) or `db_url` (`mongodb://...`; the store builds a
    pymongo client and closes it in `aclose()`); `database` names the database. Collections:
    `runs`, `events`, `snapshots`, `tool_effects`, `messages` and `counters`; their indexes are
    created on the store's first write (needs the `readWrite` role). `media_store='auto'` puts
    large message parts in a `MongoMediaStore` on the same client and database; `None` keeps them
    inline. A message, run, event or tool effect that would exceed MongoDB's 16 MiB document
    limit raises `ValueError` naming the limit and the run, and nothing of it is written. Calls on
    one run take effect in the order they were made; a write completes even if its caller is
    cancelled, and `aclose()` waits for it.
    """

    def __init__(
        self,
        *,
        client: MongoClientLike | None = None,
        db_url: str | None = None,
        database: str,
        media_store: MediaSetting = 'auto',
        media_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
    ) -> None:
        self.max_snapshots_per_run = validate_max_snapshots(max_snapshots_per_run)
        self._connection = MongoConnection.open(client=client, db_url=db_url)
        self._db = self._connection.database(database)
        media = MessageMedia.resolve(media_store, media_threshold_bytes, default=self._default_media_store)
        self.media_store: MediaStore | None = media.store
        """Where large message parts go; `None` when they stay inline."""
        self.media_threshold_bytes = media.threshold_bytes
        self._indexes = IndexSetup(self._db, STEP_INDEXES)
        self._counters = Counters(self._db)
        self._messages = MessageStore(self._db, media)
        self._runs = self._db['runs']
        self._events = self._db['events']
        self._snapshots = self._db['snapshots']
        self._effects = self._db['tool_effects']
        self._known_runs = KnownRuns()
        self._order = RunOrder()

    def _default_media_store(self) -> MediaStore:
        # Imported here: the media module builds on this package's client helpers.
        from step_persistence.media.mongo import MongoMediaStore

        return MongoMediaStore(client=self._connection.client, database=self._db.name)

    @property
    def client(self) -> MongoClientLike:
        """The client the store talks through (its own when built from `db_url`)."""
        return self._connection.client

    def __repr__(self) -> str:
        return f'{type(self).__name__}(database={self._db.name!r}, max_snapshots={self.max_snapshots_per_run!r})'

    async def create_indexes(self) -> None:
        """Create the store's indexes now (the first write does it otherwise); `IndexCreationError` on a clash."""
        await self._indexes.ensure()

    # --- runs ---

    async def register_run(self, record: RunRecord) -> None:
        await self._order.write(record.run_id, partial(self._register_run, record))

    async def _register_run(self, record: RunRecord) -> None:
        await self._indexes.ensure()
        check_document_size(run_document(record, registration=0), what='the run record', run_id=record.run_id)
        registration = await self._counters.next_registration()
        try:
            await self._runs.insert_one(run_document(record, registration=registration))
        except DuplicateKeyError:
            raise ValueError(f'run {record.run_id!r} is already registered') from None
        await self._counters.start_run(record.run_id, registration)
        self._known_runs.remember(record.run_id, registration, {})

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        document = await self._order.read(run_id, partial(self._runs.find_one, {'_id': run_id}))
        return None if document is None else read_or_skip(f'run {run_id!r}', partial(run_from_document, document))

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        query: dict[str, Any] = {}
        if parent_run_id is not None:
            query['parent_run_id'] = parent_run_id
        if conversation_id is not None:
            query['conversation_id'] = conversation_id
        order = [('started_at', ASCENDING), ('started_at_us', ASCENDING), ('registration', ASCENDING)]
        records = [
            read_or_skip(f'run {document.get("_id")!r}', partial(run_from_document, document))
            async for document in self._runs.find(query).sort(order)
        ]
        return [record for record in records if record is not None]

    async def _require_run(self, run_id: str) -> None:
        if self._known_runs.knows(run_id):
            return
        if await self._runs.find_one({'_id': run_id}, {'_id': 1}) is None:
            raise LookupError(f'run {run_id!r} is not registered')
        self._known_runs.add(run_id)

    # --- events ---

    async def append_event(self, event: StepEvent) -> None:
        await self._order.write(event.run_id, partial(self._append_event, event))

    async def _append_event(self, event: StepEvent) -> None:
        await self._indexes.ensure()
        check_document_size(event_document(event, seq=0), what='an event', run_id=event.run_id)
        allocation = await self._counters.allocate(event.run_id, event=1)
        try:
            await self._events.insert_one(event_document(event, seq=allocation.last['event']))
        except DuplicateKeyError as error:
            if not is_idempotency_conflict(error):
                raise

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        cursor = self._events.find({'run_id': run_id}).sort('seq', ASCENDING)
        documents = await self._order.read(run_id, partial(cursor.to_list, None))
        events = (
            read_or_skip(f'event {document.get("seq")!r} of run {run_id!r}', partial(event_from_document, document))
            for document in documents
        )
        return [event for event in events if event is not None]

    # --- snapshots ---

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._order.write(snapshot.run_id, partial(self._save_new_snapshot, snapshot))

    async def _save_new_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._indexes.ensure()
        try:
            await self._save_snapshot(snapshot, use_cache=True)
        except _StaleMessageNumbers:
            await self._save_snapshot(snapshot, use_cache=False)

    async def _save_snapshot(self, snapshot: ContinuableSnapshot, *, use_cache: bool) -> None:
        run_id = snapshot.run_id
        encoded = snapshot.encoded_messages()
        distinct = list({message.digest: message for message in encoded}.values())
        known = self._known_runs.messages(run_id) if use_cache else None
        if known is None:
            stored = await self._messages.numbers(run_id, [message.digest for message in distinct])
        else:
            stored = known.numbers
        fresh = await self._messages.prepare(run_id, [message for message in distinct if message.digest not in stored])
        allocation = await self._counters.allocate(run_id, snapshot=1, message=len(fresh))
        if known is not None and known.registration != allocation.registration:
            raise _StaleMessageNumbers
        added = await self._messages.insert(run_id, fresh, first_no=allocation.last['message'] - len(fresh) + 1)
        numbers = {**stored, **added}
        document = snapshot_document(
            snapshot, seq=allocation.last['snapshot'], message_refs=pack_refs([numbers[m.digest] for m in encoded])
        )
        check_document_size(document, what=f'snapshot {allocation.last["snapshot"]}', run_id=run_id)
        try:
            await self._snapshots.insert_one(document)
        except DuplicateKeyError as error:
            if not is_idempotency_conflict(error):
                raise
        else:
            if self.max_snapshots_per_run is not None:
                await self._prune(run_id, self.max_snapshots_per_run)
        self._known_runs.remember(run_id, allocation.registration, added if known is not None else numbers)

    async def _prune(self, run_id: str, max_snapshots: int) -> None:
        """Drop snapshots retention does not keep, among those visible now (never one not yet written).

        A pruned snapshot with an idempotency key stays as a tombstone (no state, no messages), so
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

    @staticmethod
    def _snapshot_query(run_id: str, include_interrupted: bool) -> dict[str, Any]:
        return {'run_id': run_id, 'state': {'$ne': None} if include_interrupted else 'complete'}

    async def _materialize(self, run_id: str, documents: list[dict[str, Any]]) -> list[ContinuableSnapshot]:
        """Snapshots for documents, in order, leaving out (and logging) any that cannot be read."""
        parsed: list[tuple[ContinuableSnapshot, list[int]]] = []
        for document in documents:
            header = read_or_skip(
                f'snapshot {document.get("seq")!r} of run {run_id!r}', partial(_parse_snapshot, document)
            )
            if header is not None:
                parsed.append(header)
        loaded = await self._messages.load(run_id, {number for _, numbers in parsed for number in numbers})
        snapshots = (
            read_or_skip(f'snapshot {header.seq} of run {run_id!r}', partial(_with_messages, header, numbers, loaded))
            for header, numbers in parsed
        )
        return [snapshot for snapshot in snapshots if snapshot is not None]

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest readable matching snapshot; unreadable newer ones are skipped and logged."""
        return await self._order.read(run_id, partial(self._latest_snapshot, run_id, include_interrupted))

    async def _latest_snapshot(self, run_id: str, include_interrupted: bool) -> ContinuableSnapshot | None:
        query = self._snapshot_query(run_id, include_interrupted)
        while True:
            page = await self._snapshots.find(query).sort('seq', DESCENDING).limit(_LATEST_PAGE).to_list(None)
            for document in page:
                found = await self._materialize(run_id, [document])
                if found:
                    return found[0]
            oldest = page[-1].get('seq') if len(page) == _LATEST_PAGE else None
            if not isinstance(oldest, int):
                return None
            query = {**query, 'seq': {'$lt': oldest}}

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """Retained matching snapshots in sequence order; unreadable ones are skipped and logged."""
        return await self._order.read(run_id, partial(self._list_snapshots, run_id, include_interrupted))

    async def _list_snapshots(self, run_id: str, include_interrupted: bool) -> list[ContinuableSnapshot]:
        cursor = self._snapshots.find(self._snapshot_query(run_id, include_interrupted)).sort('seq', ASCENDING)
        return await self._materialize(run_id, await cursor.to_list(None))

    # --- tool effects ---

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._order.write(record.run_id, partial(self._record_tool_effect, record))

    async def _record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._indexes.ensure()
        fields = tool_effect_update(record)
        check_document_size(fields, what=f'tool effect {record.tool_call_id!r}', run_id=record.run_id)
        await self._require_run(record.run_id)
        key = {'run_id': record.run_id, 'tool_call_id': record.tool_call_id}
        await upsert(partial(self._effects.update_one, key, {'$set': fields}, upsert=True))

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        query = {'run_id': run_id, 'tool_call_id': tool_call_id}
        document = await self._order.read(run_id, partial(self._effects.find_one, query))
        if document is None:
            return None
        return read_or_skip(
            f'tool effect {tool_call_id!r} of run {run_id!r}', partial(tool_effect_from_document, document)
        )

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        order = [('started_at', ASCENDING), ('started_at_us', ASCENDING), ('tool_call_id', ASCENDING)]
        cursor = self._effects.find({'run_id': run_id, 'status': 'started'}).sort(order)
        documents = await self._order.read(run_id, partial(cursor.to_list, None))
        records = (
            read_or_skip(
                f'tool effect {document.get("tool_call_id")!r} of run {run_id!r}',
                partial(tool_effect_from_document, document),
            )
            for document in documents
        )
        return [record for record in records if record is not None]

    # --- deletion and lifetime ---

    async def delete_run(self, *, run_id: str) -> None:
        """Remove the run's documents, its `runs` document last (so an interrupted delete can be redone)."""
        await self._order.write(run_id, partial(self._delete_run, run_id))

    async def _delete_run(self, run_id: str) -> None:
        self._known_runs.discard(run_id)
        for collection in (self._events, self._snapshots, self._effects):
            await collection.delete_many({'run_id': run_id})
        await self._messages.delete_run(run_id)
        await self._counters.delete_run(run_id)
        await self._runs.delete_one({'_id': run_id})

    async def aclose(self) -> None:
        """Finish writes still running, then close the client if the store built it from `db_url`.

        A caller's client stays open.
        """
        await self._order.drain()
        await self._connection.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _parse_snapshot(document: dict[str, Any]) -> tuple[ContinuableSnapshot, list[int]]:
    header, refs = snapshot_from_document(document)
    return header, unpack_refs(refs)


def _with_messages(header: ContinuableSnapshot, numbers: list[int], loaded: LoadedMessages) -> ContinuableSnapshot:
    """`header` with its messages; raises when one is missing, unreadable or malformed."""
    return header.model_copy(update={'messages': decode_messages([loaded.tree(number) for number in numbers])})
