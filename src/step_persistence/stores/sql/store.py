"""`SqlStepStore`: the `StepStore` protocol on SQLite or PostgreSQL, through one SQLAlchemy schema.

Every operation is one synchronous function run in one transaction, made of Core statements;
`Database` decides where it runs (a worker thread for SQLite, the async driver otherwise). Writes
are in `writes.py`, flushes and their snapshots in `snapshot_saves.py` (messages stored once per
history position and version; large payloads go to the media store, by default the `media`
table of the same database in the same transaction), snapshot reads in `snapshot_reads.py`, and
the other reads below.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import and_, select

from step_persistence._arguments import require_text
from step_persistence._reading import read_each, read_or_skip
from step_persistence.media.protocol import MediaStore
from step_persistence.reclaiming import MediaCollection, validate_grace
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
from step_persistence.stores._media import DEFAULT_THRESHOLD_BYTES, MediaSetting, MessageMedia
from step_persistence.stores._pruning import PrunesOldRuns
from step_persistence.stores.sql import conversations, listing, reclaiming, rows
from step_persistence.stores.sql import lifecycle as sql_lifecycle
from step_persistence.stores.sql.database import Database, DatabaseTarget
from step_persistence.stores.sql.database_store import DatabaseStore, SchemaNotReadyError
from step_persistence.stores.sql.media_store import SqlMediaStore
from step_persistence.stores.sql.schema import events, runs, snapshots, tool_effects
from step_persistence.stores.sql.snapshot_reads import SnapshotReads
from step_persistence.stores.sql.snapshot_saves import SnapshotSaves
from step_persistence.stores.sql.statements import WriteStatements
from step_persistence.stores.sql.writes import Writes

__all__ = ['SqlStepStore']


class SqlStepStore(PrunesOldRuns, DatabaseStore):
    """Runs, events, snapshots and tool effects in a SQL database (SQLite or PostgreSQL).

    `target` is one of:

    - a URL (`sqlite:///runs.db`, `sqlite://` in memory, `postgresql://user@host/db`; the async
      driver, aiosqlite or asyncpg, is filled in): the store owns its engine and disposes of it
      in `aclose()`;
    - an application's `AsyncEngine`: used as configured, never disposed;
    - an application's `AsyncConnection`: every statement runs inside the caller's transaction;
      the store never commits, rolls back or closes it (the caller does).

    `schema` (PostgreSQL only) puts the tables and the migration version table in that schema.
    `table_prefix` (say `'sp_'`) starts the name of every table, view, index and constraint of the
    store and of its version table with it (`sp_runs`, `sp_messages`...): a database the
    application shares keeps its own `messages` or `runs` (see docs/sql.md).
    With `auto_migrate` (the default) the schema is created or upgraded before the first write;
    otherwise run `step-persistence db upgrade` (see docs/sql.md) or `await store.migrate()` first.
    Reading never writes: a read creates and migrates nothing. On a database that holds no tables
    yet (a SQLite file that does not exist, a database or schema without them) reads find nothing;
    on tables at an older revision they raise `SchemaNotReadyError`, naming the upgrade (see
    `database_store.py`).

    `media_store='auto'` (the default) moves every binary payload, and every string of at least
    `media_threshold_bytes` UTF-8 bytes, to a `SqlMediaStore` on the same database: blob rows
    are written in the same transaction as the messages that refer to them (the caller's, for
    an `AsyncConnection`). Pass another `MediaStore` to put them elsewhere (its blobs are stored
    before the write transaction), or `None` to keep everything inline. Reads put the original
    bytes and text back.

    On SQLite each operation is one call to a worker thread of the store's own; on PostgreSQL,
    and on an application's engine or connection, it runs on the event loop through the async
    driver (see docs/sql.md, "Execution model").
    """

    def __init__(
        self,
        target: DatabaseTarget,
        *,
        schema: str | None = None,
        table_prefix: str = '',
        auto_migrate: bool = True,
        max_snapshots_per_run: int | None = None,
        media_store: MediaSetting = 'auto',
        media_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
    ) -> None:
        self._start(
            Database.open(target, schema=schema, table_prefix=table_prefix),
            auto_migrate=auto_migrate,
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
        )

    def _start(
        self,
        database: Database,
        *,
        auto_migrate: bool,
        max_snapshots_per_run: int | None,
        media_store: MediaSetting,
        media_threshold_bytes: int,
    ) -> None:
        """Build the store on `database` (what every constructor of this class and of its front doors ends in)."""
        self.max_snapshots_per_run = validate_max_snapshots(max_snapshots_per_run)
        self._attach(database, auto_migrate=auto_migrate)
        self._own_media_store: SqlMediaStore | None = None
        media = MessageMedia.resolve(media_store, media_threshold_bytes, default=self._default_media_store)
        self.media_store: MediaStore | None = media.store
        """Where large message payloads go; `None` when they stay inline."""
        self.media_threshold_bytes = media.threshold_bytes
        statements = WriteStatements.for_dialect(database.dialect_name)
        self._writes = Writes(statements)
        self._snapshot_saves = SnapshotSaves(
            database,
            media,
            statements,
            self._writes,
            staged_media=self._own_media_store,
            cache_heads=not database.in_caller_transaction,
            max_snapshots=self.max_snapshots_per_run,
        )
        self._snapshot_reads = SnapshotReads(database, media)

    def _default_media_store(self) -> MediaStore:
        self._own_media_store = SqlMediaStore.sharing(self._db, auto_migrate=self._auto_migrate)
        return self._own_media_store

    # --- plumbing ---

    async def _read(self, statement: Any) -> list[Any]:
        """The rows of one query, read in a transaction of its own (a value that cannot be decoded makes only
        its row unreadable: `rows.fetch`); none from a database that holds no tables yet."""
        if not await self._ready_to_read():
            return []
        return await self._db.run(partial(rows.fetch, statement=statement), write=False)

    async def _holds_nothing(self) -> bool:
        """Whether the database holds no tables yet, so that removing from it has nothing to do (and creates
        nothing); tables at another revision are upgraded by the write, as `_ready` does."""
        try:
            return not await self._ready_to_read()
        except SchemaNotReadyError:
            return False

    # --- runs ---

    async def register_run(self, record: RunRecord) -> None:
        rows.require_storable(record)
        await self._ready()
        run_pk, was_bare = await self._db.run(partial(self._writes.register_run, record=record), write=True)
        if was_bare:  # its head is what it saved while bare, or its origin's view: read at its next save
            self._snapshot_saves.forget(record.run_id)
        else:
            self._snapshot_saves.registered(record, run_pk)

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        require_text('run_id', run_id)
        found = await self._read(select(*rows.RUN_COLUMNS).where(runs.c.run_id == run_id))
        return None if not found else read_or_skip(f'run {run_id!r}', partial(rows.run_from_row, found[0]._mapping))

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
        chosen = RunFilter(
            parent_run_id=parent_run_id,
            conversation_id=conversation_id,
            agent_name=agent_name,
            origin_run_id=origin_run_id,
            run_id_prefix=run_id_prefix,
            limit=limit,
            newest_first=newest_first,
        )
        return read_each(await self._read(listing.runs_query(chosen)), _run_name, _run_from_row)

    async def list_conversations(
        self, *, limit: int | None = None, newest_first: bool = True, agent_name: str | None = None
    ) -> list[ConversationSummary]:
        ConversationFilter(limit=limit, newest_first=newest_first, agent_name=agent_name)
        query = conversations.summaries_query(limit=limit, newest_first=newest_first, agent_name=agent_name)
        if not await self._ready_to_read():
            return []
        found = await self._db.run(
            partial(rows.fetch, statement=query, parameters={'agent_name': agent_name}), write=False
        )
        return read_each(
            found,
            lambda row: f'conversation {row.conversation_id!r}',
            lambda row: conversations.summary_from_row(row._mapping),
        )

    async def find_snapshot(self, *, conversation_id: str, history_digest: str) -> SnapshotRef | None:
        require_text('conversation_id', conversation_id)
        require_text('history_digest', history_digest)
        for run_id, seq in await self._read(listing.snapshots_of_history(conversation_id, history_digest)):
            found = read_or_skip(
                f'snapshot {seq!r} of run {run_id!r}',
                partial(SnapshotRef.model_validate, {'run_id': run_id, 'seq': seq}, strict=True),
            )
            if found is not None:
                return found
        return None

    # --- events ---

    async def append_event(self, event: StepEvent) -> None:
        rows.require_storable(event)
        await self._ready()
        await self._db.run(partial(self._writes.append_event, event=event), write=True)

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        require_text('run_id', run_id)
        statement = select(events.c.id, *rows.EVENT_COLUMNS).where(events.c.run_id == run_id).order_by(events.c.id)
        return read_each(
            await self._read(statement),
            lambda row: f'event {row.id} of run {run_id!r}',
            lambda row: rows.event_from_row(row._mapping),
        )

    # --- snapshots ---

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self.write_batch(StepWrites(snapshots=[snapshot]))

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        require_text('run_id', run_id)
        if not await self._ready_to_read():
            return None
        return await self._snapshot_reads.latest(run_id, include_interrupted=include_interrupted)

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        require_text('run_id', run_id)
        if not await self._ready_to_read():
            return []
        return await self._snapshot_reads.every(run_id, include_interrupted=include_interrupted)

    async def list_snapshot_states(self, *, run_id: str) -> list[SnapshotState]:
        require_text('run_id', run_id)
        statement = select(snapshots.c.seq, snapshots.c.state).where(snapshots.c.run_id == run_id)
        found = await self._read(statement.order_by(snapshots.c.seq))
        return read_each(
            found, lambda row: f'snapshot {row.seq} of run {run_id!r}', lambda row: stored_snapshot_state(row.state)
        )

    # --- tool effects ---

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        rows.require_storable(record)
        await self._ready()
        await self._db.run(partial(self._writes.record_tool_effect, record=record), write=True)

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        require_text('run_id', run_id)
        require_text('tool_call_id', tool_call_id)
        found = await self._read(
            select(*rows.TOOL_EFFECT_COLUMNS).where(
                tool_effects.c.run_id == run_id, tool_effects.c.tool_call_id == tool_call_id
            )
        )
        if not found:
            return None
        return read_or_skip(
            f'tool effect {tool_call_id!r} of run {run_id!r}', partial(rows.tool_effect_from_row, found[0]._mapping)
        )

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        require_text('run_id', run_id)
        return await self._tool_effects(
            run_id,
            select(*rows.TOOL_EFFECT_COLUMNS)
            .where(and_(tool_effects.c.run_id == run_id, tool_effects.c.status == 'started'))
            .order_by(tool_effects.c.started_at, tool_effects.c.tool_call_id),
        )

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        require_text('run_id', run_id)
        return await self._tool_effects(run_id, sql_lifecycle.tool_effects_of_run(run_id))

    async def _tool_effects(self, run_id: str, query: Any) -> list[ToolEffectRecord]:
        return read_each(
            await self._read(query),
            lambda row: f'tool effect {row.tool_call_id!r} of run {run_id!r}',
            lambda row: rows.tool_effect_from_row(row._mapping),
        )

    # --- batches ---

    async def write_batch(self, writes: StepWrites) -> None:
        """Apply tool effects, events and snapshots in one transaction: all of them land, or none.

        Messages that the snapshots add are packed first (their blobs staged for this transaction
        or, for a media store elsewhere, stored); if another writer of a run got in between, the
        packing and the transaction are done again (see `snapshot_saves.py`). `ValueError`, before anything
        is written, for an id or key longer than `rows.MAX_INDEXED_BYTES` or a step index outside
        `rows.STEP_INDEX_RANGE`.
        """
        for effect in writes.tool_effects:
            rows.require_storable(effect)
        for event in writes.events:
            rows.require_storable(event)
        for snapshot in writes.snapshots:
            rows.require_storable(snapshot)
        await self._ready()
        await self._snapshot_saves.write_batch(writes)

    # --- deletion and lifecycle ---

    async def delete_run(self, *, run_id: str, cascade: bool = False) -> None:
        """Delete the run (with `cascade`, its delegated runs too) in one transaction (nothing, and nothing
        created, on a database that holds no tables yet)."""
        require_text('run_id', run_id)
        if await self._holds_nothing():
            return
        await self._ready()
        deleted = await self._db.run(
            partial(sql_lifecycle.delete_runs, writes=self._writes, run_id=run_id, cascade=cascade), write=True
        )
        for deleted_id in deleted:
            self._snapshot_saves.forget(deleted_id)

    async def runs_started_before(self, cutoff: datetime) -> list[RunRecord]:
        """The runs that started before `cutoff`, oldest first, found with an indexed query (for `prune_runs`)."""
        found = await self._read(sql_lifecycle.runs_started_before(cutoff))
        return read_each(found, _run_name, _run_from_row)

    async def collect_media(self, *, grace: timedelta) -> MediaCollection:
        """Delete message rows no snapshot uses and unreferenced blobs (see `stores/sql/reclaiming.py`); on a
        database that holds no tables yet, nothing (and nothing is created)."""
        validate_grace(grace)
        if await self._holds_nothing():
            return MediaCollection(messages=0, blobs=0)
        await self._ready()
        return await reclaiming.collect_media(self._db, self.media_store, grace=grace)


def _run_name(row: Any) -> str:
    return f'run {row.run_id!r}'


def _run_from_row(row: Any) -> RunRecord:
    return rows.run_from_row(row._mapping)
