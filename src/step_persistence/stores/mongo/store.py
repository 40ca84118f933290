"""`MongoStepStore`: the `StepStore` protocol on MongoDB, through an async driver (pymongo or motor).

Uniqueness is enforced by the server, never by reading first: a run is its `runs` document
(`_id` = run id), idempotency keys, tool calls, continued origins and message numbers have unique
indexes, and every sequence number comes from an atomic `$inc` on the run's `counters` document.
No operation needs a transaction, so a standalone server works as well as a replica set. See
docs/mongo.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Final

from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.collection import AsyncCollection

from step_persistence import lifecycle
from step_persistence._arguments import require_text
from step_persistence._closing import ClosesOnExit
from step_persistence._reading import read_each, read_or_skip, read_or_skip_async
from step_persistence.media.protocol import MediaStore
from step_persistence.media.walker import DEFAULT_THRESHOLD_BYTES
from step_persistence.reclaiming import MediaCollection
from step_persistence.records import (
    ContinuableSnapshot,
    ConversationSummary,
    RunRecord,
    SnapshotRef,
    SnapshotState,
    StepEvent,
    StepWrites,
    ToolEffectRecord,
)
from step_persistence.retention import validate_max_snapshots
from step_persistence.stores._listing import ConversationFilter, RunFilter, stored_snapshot_state
from step_persistence.stores._media import MediaSetting, MessageMedia
from step_persistence.stores._pruning import PrunesOldRuns
from step_persistence.stores.mongo._call_order import CallOrder
from step_persistence.stores.mongo._client import Database, MongoClientLike, MongoConnection
from step_persistence.stores.mongo._conversations import Conversations
from step_persistence.stores.mongo._counters import Counters
from step_persistence.stores.mongo._documents import (
    event_from_document,
    run_document,
    run_from_document,
    snapshot_from_document,
    tool_effect_from_document,
)
from step_persistence.stores.mongo._heads import RunHeads
from step_persistence.stores.mongo._indexes import OBSOLETE_STEP_INDEXES, STEP_INDEXES, IndexSetup
from step_persistence.stores.mongo._known_runs import KnownRuns, Registered
from step_persistence.stores.mongo._lifecycle import TOOL_EFFECT_ORDER, started_before_query
from step_persistence.stores.mongo._limits import check_document_size
from step_persistence.stores.mongo._lines import LineBases
from step_persistence.stores.mongo._loops import PerLoop
from step_persistence.stores.mongo._messages import MessageStore
from step_persistence.stores.mongo._reclaiming import collect_media, release_lines
from step_persistence.stores.mongo._runs import fill_bare_run, find_runs, find_snapshot, insert_run, run_query
from step_persistence.stores.mongo._writes import RunWriter, RunWrites, by_run
from step_persistence.stores.mongo.media_store import MongoMediaStore

__all__ = ['MongoStepStore']

_LATEST_PAGE: Final = 4
"""How many snapshot headers `latest_snapshot` reads at a time while skipping unreadable ones."""


@dataclass(frozen=True, slots=True)
class _OnLoop:
    """What the store builds on its client's database, for one event loop (see `_loops.py`)."""

    db: Database
    runs: AsyncCollection[dict[str, Any]]
    events: AsyncCollection[dict[str, Any]]
    snapshots: AsyncCollection[dict[str, Any]]
    effects: AsyncCollection[dict[str, Any]]
    conversations: Conversations
    indexes: IndexSetup
    counters: Counters
    bases: LineBases
    messages: MessageStore
    known_runs: KnownRuns
    order: CallOrder
    writer: RunWriter


class MongoStepStore(PrunesOldRuns, ClosesOnExit):
    """Runs, events, snapshots and tool effects in one MongoDB database.

    Give exactly one of `client` (a pymongo `AsyncMongoClient` or motor `AsyncIOMotorClient`
    the caller owns: never closed by the store, and used as it is, so from its own event loop only)
    or `db_url` (`mongodb://...`; the store builds a pymongo client for each event loop it is used
    from in turn, closes the one it leaves on that loop, and the last in `aclose()`); `database`
    names the database. Collections: `runs`, `events`, `snapshots`, `tool_effects`, `messages`,
    `lines`, `conversations` and `counters`; their indexes are created on the store's first write
    (needs the `readWrite` role). `media_store='auto'` puts large message parts in a
    `MongoMediaStore` on the same client and database; `None` keeps them inline. A message, run,
    event or tool effect that would exceed MongoDB's 16 MiB document limit raises `ValueError`
    naming the limit and the run, and nothing of it is written. Calls on
    one run take effect in the order they were made; a write completes even if its caller is
    cancelled, and `aclose()` waits for it. `write_batch` applies several writes in a few round
    trips (see docs/mongo.md). Every id and filter must be a `str` (`TypeError` before anything
    is sent: a query operator such as `{'$ne': None}` passed as an id would match other runs'
    documents), and a damaged document is skipped and logged, never returned.
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
        self._database = self._connection.database(database).name
        self._media = MessageMedia.resolve(media_store, media_threshold_bytes, default=self._default_media_store)
        self.media_store: MediaStore | None = self._media.store
        """Where large message parts go; `None` when they stay inline."""
        self.media_threshold_bytes = self._media.threshold_bytes
        self._on_loop = PerLoop(self._connection, self._build)

    def _build(self, client: MongoClientLike) -> _OnLoop:
        db = self._connection.database(self._database, client)
        conversations = Conversations(db)
        counters = Counters(db)
        bases = LineBases(db)
        messages = MessageStore(db, self._media, bases)
        known_runs = KnownRuns()
        return _OnLoop(
            db=db,
            runs=db['runs'],
            events=db['events'],
            snapshots=db['snapshots'],
            effects=db['tool_effects'],
            conversations=conversations,
            indexes=IndexSetup(db, STEP_INDEXES, obsolete=OBSOLETE_STEP_INDEXES, then=conversations.build),
            counters=counters,
            bases=bases,
            messages=messages,
            known_runs=known_runs,
            order=CallOrder(),
            writer=RunWriter(
                db,
                counters=counters,
                messages=messages,
                bases=bases,
                heads=RunHeads(db, messages, known_runs),
                known_runs=known_runs,
                max_snapshots_per_run=self.max_snapshots_per_run,
            ),
        )

    def _default_media_store(self) -> MediaStore:
        return MongoMediaStore.sharing(self._connection, database=self._database)

    @property
    def client(self) -> MongoClientLike:
        """The client the store talks through (its own when built from `db_url`: the one of the latest event loop)."""
        return self._connection.client

    def __repr__(self) -> str:
        return f'{type(self).__name__}(database={self._database!r}, max_snapshots={self.max_snapshots_per_run!r})'

    async def create_indexes(self) -> None:
        """Create the store's indexes now, those of `lines` and `conversations` included (writes create
        them otherwise, as they need them); `IndexCreationError` on a clash."""
        on = self._on_loop.get()
        await on.indexes.ensure()
        await on.bases.create_index()
        await on.conversations.create_index()

    # --- runs ---

    async def register_run(self, record: RunRecord) -> None:
        on = self._on_loop.get()
        await on.order.write([record.run_id], partial(self._register_run, on, record))

    @staticmethod
    async def _register_run(on: _OnLoop, record: RunRecord) -> None:
        """Insert the run's document, or fill in its bare one (which keeps its registration number)."""
        await on.indexes.ensure()
        check_document_size(run_document(record, registration=0), what='the run record', run_id=record.run_id)
        registration = await on.counters.next_registration()
        try:
            stored = await insert_run(on.runs, record, registration)
        except ValueError:
            filled = await fill_bare_run(on.runs, record)
            if filled is None:
                raise
            stored, registration = filled
            await on.conversations.added(stored, registration)
            on.known_runs.forget_head(record.run_id)  # its head: what it saved while bare, or its origin's view
            return
        await on.counters.start_run(record.run_id, registration)
        await on.conversations.added(stored, registration)
        on.known_runs.remember(record.run_id, Registered(registration=registration, origin=stored.origin))

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        require_text('run_id', run_id)
        on = self._on_loop.get()
        document = await on.order.read(run_id, partial(on.runs.find_one, {'_id': run_id}))
        return None if document is None else read_or_skip(f'run {run_id!r}', partial(run_from_document, document))

    async def list_runs(
        self,
        *,
        parent_run_id: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        origin_run_id: str | None = None,
        run_id_prefix: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[RunRecord]:
        """Matching runs in order, each filter served by an index that also gives the order (see `_runs.py`)."""
        chosen = RunFilter(
            parent_run_id=parent_run_id,
            conversation_id=conversation_id,
            agent_name=agent_name,
            origin_run_id=origin_run_id,
            run_id_prefix=run_id_prefix,
            limit=limit,
            newest_first=newest_first,
        )
        runs = self._on_loop.get().runs
        return await find_runs(runs, run_query(chosen), limit=chosen.limit, newest_first=newest_first)

    async def list_conversations(
        self, *, limit: int | None = None, newest_first: bool = True, agent_name: str | None = None
    ) -> list[ConversationSummary]:
        """Conversation summaries from the `conversations` collection (see `_conversations.py`)."""
        ConversationFilter(limit=limit, newest_first=newest_first, agent_name=agent_name)
        conversations = self._on_loop.get().conversations
        return await conversations.summaries(limit=limit, newest_first=newest_first, agent_name=agent_name)

    async def find_snapshot(self, *, conversation_id: str, history_digest: str) -> SnapshotRef | None:
        db = self._on_loop.get().db
        return await find_snapshot(db, conversation_id=conversation_id, history_digest=history_digest)

    # --- writes ---

    async def write_batch(self, writes: StepWrites) -> None:
        """Apply tool effects, then events, then snapshots, as the individual calls would, in a few round trips.

        Not atomic (no transactions): everything is checked before the first write, and a failure
        afterwards leaves the writes before it in place, as the individual calls would.
        """
        if writes.is_empty():
            return
        runs = by_run(writes)
        on = self._on_loop.get()
        await on.order.write(runs, partial(self._write, on, runs))

    @staticmethod
    async def _write(on: _OnLoop, runs: dict[str, RunWrites]) -> None:
        await on.indexes.ensure()
        for run_id, writes in runs.items():
            await on.writer.apply(run_id, writes)

    async def _write_one(self, run_id: str, writes: RunWrites) -> None:
        on = self._on_loop.get()
        await on.order.write([run_id], partial(self._write, on, {run_id: writes}))

    # --- events ---

    async def append_event(self, event: StepEvent) -> None:
        await self._write_one(event.run_id, RunWrites(events=[event]))

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        require_text('run_id', run_id)
        on = self._on_loop.get()
        cursor = on.events.find({'run_id': run_id}).sort('seq', ASCENDING)
        documents = await on.order.read(run_id, partial(cursor.to_list, None))
        return read_each(
            documents, lambda document: f'event {document.get("seq")!r} of run {run_id!r}', event_from_document
        )

    # --- snapshots ---

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._write_one(snapshot.run_id, RunWrites(snapshots=[snapshot]))

    @staticmethod
    def _snapshot_query(run_id: str, include_interrupted: bool) -> dict[str, Any]:
        return {'run_id': run_id, 'state': {'$ne': None} if include_interrupted else 'complete'}

    @staticmethod
    async def _snapshot(on: _OnLoop, run_id: str, document: dict[str, Any]) -> ContinuableSnapshot | None:
        """The snapshot `document` stores, with its messages; `None` (logged) if it cannot be read."""

        async def read() -> ContinuableSnapshot:
            header, view = snapshot_from_document(document)
            return header.model_copy(update={'messages': await on.messages.history(view)})

        return await read_or_skip_async(f'snapshot {document.get("seq")!r} of run {run_id!r}', read)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest readable matching snapshot; unreadable newer ones are skipped and logged."""
        require_text('run_id', run_id)
        on = self._on_loop.get()
        return await on.order.read(run_id, partial(self._latest_snapshot, on, run_id, include_interrupted))

    async def _latest_snapshot(self, on: _OnLoop, run_id: str, include_interrupted: bool) -> ContinuableSnapshot | None:
        matching = self._snapshot_query(run_id, include_interrupted)
        query, offset = matching, 0
        while True:
            cursor = on.snapshots.find(query).sort([('seq', DESCENDING), ('_id', DESCENDING)])
            page = await cursor.skip(offset).limit(_LATEST_PAGE).to_list(None)
            for document in page:
                snapshot = await self._snapshot(on, run_id, document)
                if snapshot is not None:
                    return snapshot
            if len(page) < _LATEST_PAGE:
                return None
            oldest = page[-1].get('seq')
            if isinstance(oldest, int) and not isinstance(oldest, bool):
                query, offset = {**matching, 'seq': {'$lt': oldest}}, 0
            else:  # a damaged seq (text, a fraction, a list) is no bound: page on past it
                offset += _LATEST_PAGE

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """Retained matching snapshots in sequence order; unreadable ones are skipped and logged."""
        require_text('run_id', run_id)
        on = self._on_loop.get()
        return await on.order.read(run_id, partial(self._list_snapshots, on, run_id, include_interrupted))

    async def _list_snapshots(self, on: _OnLoop, run_id: str, include_interrupted: bool) -> list[ContinuableSnapshot]:
        cursor = on.snapshots.find(self._snapshot_query(run_id, include_interrupted)).sort('seq', ASCENDING)
        snapshots = [await self._snapshot(on, run_id, document) for document in await cursor.to_list(None)]
        return [snapshot for snapshot in snapshots if snapshot is not None]

    async def list_snapshot_states(self, *, run_id: str) -> list[SnapshotState]:
        require_text('run_id', run_id)
        on = self._on_loop.get()
        query = self._snapshot_query(run_id, include_interrupted=True)
        cursor = on.snapshots.find(query, {'_id': False, 'seq': True, 'state': True}).sort('seq', ASCENDING)
        documents = await on.order.read(run_id, partial(cursor.to_list, None))
        return read_each(
            documents,
            lambda document: f'snapshot {document.get("seq")!r} of run {run_id!r}',
            lambda document: stored_snapshot_state(document.get('state')),
        )

    # --- tool effects ---

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._write_one(record.run_id, RunWrites(tool_effects=[record]))

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        require_text('run_id', run_id)
        require_text('tool_call_id', tool_call_id)
        on = self._on_loop.get()
        query = {'run_id': run_id, 'tool_call_id': tool_call_id}
        document = await on.order.read(run_id, partial(on.effects.find_one, query))
        if document is None:
            return None
        return read_or_skip(
            f'tool effect {tool_call_id!r} of run {run_id!r}', partial(tool_effect_from_document, document)
        )

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        require_text('run_id', run_id)
        return await self._tool_effects(run_id, {'run_id': run_id, 'status': 'started'})

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        require_text('run_id', run_id)
        return await self._tool_effects(run_id, {'run_id': run_id})

    async def _tool_effects(self, run_id: str, query: dict[str, Any]) -> list[ToolEffectRecord]:
        on = self._on_loop.get()
        cursor = on.effects.find(query).sort(TOOL_EFFECT_ORDER)
        documents = await on.order.read(run_id, partial(cursor.to_list, None))
        return read_each(
            documents,
            lambda document: f'tool effect {document.get("tool_call_id")!r} of run {run_id!r}',
            tool_effect_from_document,
        )

    # --- deletion and lifetime ---

    async def delete_run(self, *, run_id: str, cascade: bool = False) -> None:
        """Remove the run's documents, its `runs` document last (so an interrupted delete can be redone).

        The message documents of its lines that no other view uses go first (`_reclaiming.py`).

        With `cascade`, every run delegated from it first, each after the runs delegated from it.
        """
        require_text('run_id', run_id)
        if cascade:
            await lifecycle.delete_delegated_runs(self, run_id)
        on = self._on_loop.get()
        await on.order.write([run_id], partial(self._delete_run, on, run_id))

    async def runs_started_before(self, cutoff: datetime) -> list[RunRecord]:
        """The runs that started before `cutoff`, oldest first, found with the `started_at` index (for `prune_runs`)."""
        if not isinstance(cutoff, datetime):
            raise TypeError(f'cutoff must be a datetime, not {type(cutoff).__name__}')
        return await find_runs(self._on_loop.get().runs, started_before_query(cutoff))

    @staticmethod
    async def _delete_run(on: _OnLoop, run_id: str) -> None:
        on.known_runs.discard(run_id)
        run = await on.runs.find_one({'_id': run_id}, {'conversation_id': 1})
        await release_lines(on.db, run_id)
        for collection in (on.events, on.snapshots, on.effects):
            await collection.delete_many({'run_id': run_id})
        await on.counters.delete_run(run_id)
        conversation_id = None if run is None else run.get('conversation_id')
        if isinstance(conversation_id, str):
            await on.conversations.removing(run_id, conversation_id)
        await on.runs.delete_one({'_id': run_id})

    async def collect_media(self, *, grace: timedelta) -> MediaCollection:
        """Delete message documents no snapshot uses and unreferenced blobs (see `_reclaiming.py`)."""
        return await collect_media(self._on_loop.get().db, self.media_store, grace=grace)

    async def aclose(self) -> None:
        """Finish writes still running on this event loop, then close the client if the store built it from `db_url`.

        A caller's client stays open.
        """
        on = self._on_loop.built_for_running_loop()
        if on is not None:
            await on.order.drain()
        await self._connection.aclose()
