"""`SqlStepStore`: the `StepStore` protocol on SQLite or PostgreSQL, through one SQLAlchemy schema.

Every operation is one transaction on one connection, made of Core statements. Uniqueness
(runs, event and snapshot idempotency keys, tool-effect keys) is enforced by constraints with
`INSERT ... ON CONFLICT`, never by reading first. Snapshot sequence numbers come from the run's
row (`UPDATE runs ... RETURNING`), which also serializes concurrent snapshot writers of one run,
across processes, and tells each writer whether the run's messages are as it last saw them.
Messages are stored once per history position and version (`histories.py`); large payloads go
to the media store (by default the `media` table of the same database, in the same transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Table, and_, delete, func, literal, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import Label

from step_persistence._reading import read_or_skip, read_or_skip_async
from step_persistence.media.protocol import MediaStore
from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, StepWrites, ToolEffectRecord
from step_persistence.retention import retained_seqs, validate_max_snapshots
from step_persistence.stores._media import DEFAULT_THRESHOLD_BYTES, MediaSetting, MessageMedia
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.dialects import dialect_insert
from step_persistence.stores.sql.histories import HistoryRows, SavedHistory
from step_persistence.stores.sql.migrate import upgrade
from step_persistence.stores.sql.schema import events, messages, runs, snapshot_keys, snapshots, tool_effects

__all__ = ['SqlStepStore']

_CHILD_TABLES = (events, messages, snapshots, snapshot_keys, tool_effects)


@dataclass(frozen=True)
class _FetchedSnapshot:
    """A snapshot row and its message rows, read in one transaction, not yet decoded."""

    header: ContinuableSnapshot
    history: rows.StoredHistory
    found: list[Any]


class SqlStepStore:
    """Runs, events, snapshots and tool effects in a SQL database (SQLite or PostgreSQL).

    `target` is one of:

    - a URL (`sqlite:///runs.db`, `sqlite://` in memory, `postgresql://user@host/db`; the async
      driver, aiosqlite or asyncpg, is filled in): the store owns its engine and disposes of it
      in `aclose()`;
    - an application's `AsyncEngine`: used as configured, never disposed;
    - an application's `AsyncConnection`: every statement runs inside the caller's transaction;
      the store never commits, rolls back or closes it (the caller does).

    `schema` (PostgreSQL only) puts the tables and the migration version table in that schema.
    With `auto_migrate` (the default) the schema is created or upgraded on first use; otherwise
    run `alembic upgrade head` (see docs/sql.md) or `await store.migrate()` first.

    `media_store='auto'` (the default) moves every binary payload, and every string of at least
    `media_threshold_bytes` UTF-8 bytes, to a `SqlMediaStore` on the same database: blob rows
    are written in the same transaction as the messages that refer to them (the caller's, for
    an `AsyncConnection`). Pass another `MediaStore` to put them elsewhere, or `None` to keep
    everything inline. Reads put the original bytes and text back.
    """

    def __init__(
        self,
        target: str | URL | AsyncEngine | AsyncConnection | Database,
        *,
        schema: str | None = None,
        auto_migrate: bool = True,
        max_snapshots_per_run: int | None = None,
        media_store: MediaSetting = 'auto',
        media_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
    ) -> None:
        self.max_snapshots_per_run = validate_max_snapshots(max_snapshots_per_run)
        self._db = Database.open(target, schema=schema)
        self._auto_migrate = auto_migrate
        media = MessageMedia.resolve(media_store, media_threshold_bytes, default=self._default_media_store)
        self.media_store: MediaStore | None = media.store
        """Where large message payloads go; `None` when they stay inline."""
        self.media_threshold_bytes = media.threshold_bytes
        self._insert = dialect_insert(self._db.dialect_name)
        self._histories = HistoryRows(self._db, media, cache_heads=not self._db.in_caller_transaction)

    def _default_media_store(self) -> MediaStore:
        # Imported here: step_persistence.media.sql builds on this package.
        from step_persistence.media.sql import SqlMediaStore

        return SqlMediaStore.sharing(self._db, auto_migrate=self._auto_migrate)

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self._db.description})'

    # --- plumbing ---

    async def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (what `auto_migrate` does on first use)."""
        await upgrade(self._db)
        self._db.schema_upgraded()

    async def _ready(self) -> None:
        if self._auto_migrate:
            await self._db.ensure_schema(upgrade)

    async def _run_exists(self, connection: AsyncConnection, run_id: str) -> bool:
        result = await self._db.execute(connection, select(runs.c.id).where(runs.c.run_id == run_id))
        return result.first() is not None

    # --- runs ---

    async def register_run(self, record: RunRecord) -> None:
        await self._ready()
        statement = (
            self._insert(runs)
            .values(rows.run_values(record))
            .on_conflict_do_nothing(index_elements=[runs.c.run_id])
            .returning(runs.c.id)
        )
        async with self._db.transaction(write=True) as connection:
            inserted = (await self._db.execute(connection, statement)).first()
        if inserted is None:
            raise ValueError(f'run {record.run_id!r} is already registered')

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        await self._ready()
        async with self._db.transaction(write=False) as connection:
            row = (await self._db.execute(connection, select(*rows.RUN_COLUMNS).where(runs.c.run_id == run_id))).first()
        return None if row is None else read_or_skip(f'run {run_id!r}', partial(rows.run_from_row, row._mapping))

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        await self._ready()
        statement = select(*rows.RUN_COLUMNS).order_by(runs.c.started_at, runs.c.id)
        if parent_run_id is not None:
            statement = statement.where(runs.c.parent_run_id == parent_run_id)
        if conversation_id is not None:
            statement = statement.where(runs.c.conversation_id == conversation_id)
        async with self._db.transaction(write=False) as connection:
            found = (await self._db.execute(connection, statement)).all()
        records = (read_or_skip(f'run {row.run_id!r}', partial(rows.run_from_row, row._mapping)) for row in found)
        return [record for record in records if record is not None]

    # --- events ---

    async def append_event(self, event: StepEvent) -> None:
        await self._ready()
        async with self._db.transaction(write=True) as connection:
            await self._append_event(connection, event)

    async def _append_event(self, connection: AsyncConnection, event: StepEvent) -> None:
        values = rows.event_values(event)
        source = select(
            *(runs.c.run_id if name == 'run_id' else _literal(events, name, value) for name, value in values.items())
        )
        statement = (
            self._insert(events)
            .from_select(list(values), source.where(runs.c.run_id == event.run_id))
            .on_conflict_do_nothing(
                index_elements=[events.c.run_id, events.c.idempotency_key],
                index_where=events.c.idempotency_key.is_not(None),
            )
        )
        written = (await self._db.execute(connection, statement)).rowcount
        if written == 0 and not await self._run_exists(connection, event.run_id):
            raise LookupError(f'run {event.run_id!r} is not registered')

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        await self._ready()
        statement = select(events.c.id, *rows.EVENT_COLUMNS).where(events.c.run_id == run_id).order_by(events.c.id)
        async with self._db.transaction(write=False) as connection:
            found = (await self._db.execute(connection, statement)).all()
        read = (
            read_or_skip(f'event {row.id} of run {run_id!r}', partial(rows.event_from_row, row._mapping))
            for row in found
        )
        return [event for event in read if event is not None]

    # --- snapshots ---

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._ready()
        async with self._db.transaction(write=True) as connection:
            saved = await self._save_snapshot(connection, snapshot)
        if saved is not None:
            self._histories.committed(snapshot.run_id, saved)

    async def _save_snapshot(self, connection: AsyncConnection, snapshot: ContinuableSnapshot) -> SavedHistory | None:
        """Write the snapshot in `connection`'s transaction; what to tell the history cache once it commits."""
        run_id = snapshot.run_id
        if snapshot.idempotency_key is not None and not await self._claim_snapshot_key(connection, snapshot):
            return None
        allocated = (
            await self._db.execute(
                connection,
                update(runs)
                .where(runs.c.run_id == run_id)
                .values(last_snapshot_seq=runs.c.last_snapshot_seq + 1)
                .returning(runs.c.id, runs.c.last_snapshot_seq, runs.c.last_message_no),
            )
        ).first()
        if allocated is None:
            raise LookupError(f'run {run_id!r} is not registered')
        run_pk, seq, last_no = allocated
        saved = await self._histories.save(
            connection, run_id=run_id, run_pk=run_pk, last_no=last_no, encoded=snapshot.encoded_messages()
        )
        await self._db.execute(
            connection,
            snapshots.insert().values(rows.snapshot_values(snapshot, seq=seq, history=saved.reference)),
        )
        if self.max_snapshots_per_run is not None:
            await self._prune(connection, run_id, self.max_snapshots_per_run)
        return saved

    async def _claim_snapshot_key(self, connection: AsyncConnection, snapshot: ContinuableSnapshot) -> bool:
        """Record the snapshot's idempotency key; `False` if the run already used it."""
        source = select(runs.c.run_id, _literal(snapshot_keys, 'idempotency_key', snapshot.idempotency_key))
        statement = (
            self._insert(snapshot_keys)
            .from_select(['run_id', 'idempotency_key'], source.where(runs.c.run_id == snapshot.run_id))
            .on_conflict_do_nothing(index_elements=[snapshot_keys.c.run_id, snapshot_keys.c.idempotency_key])
        )
        if (await self._db.execute(connection, statement)).rowcount:
            return True
        if not await self._run_exists(connection, snapshot.run_id):
            raise LookupError(f'run {snapshot.run_id!r} is not registered')
        return False

    async def _prune(self, connection: AsyncConnection, run_id: str, max_snapshots: int) -> None:
        stored = select(snapshots.c.seq, snapshots.c.state).where(snapshots.c.run_id == run_id)
        keep = retained_seqs([(seq, state) for seq, state in await self._db.execute(connection, stored)], max_snapshots)
        await self._db.execute(
            connection, delete(snapshots).where(snapshots.c.run_id == run_id, snapshots.c.seq.not_in(keep))
        )

    def _header_query(self, run_id: str, include_interrupted: bool) -> Any:
        statement = select(*rows.SNAPSHOT_HEADER_COLUMNS).where(snapshots.c.run_id == run_id)
        return statement if include_interrupted else statement.where(snapshots.c.state == 'complete')

    async def _fetch(
        self, connection: AsyncConnection, run_id: str, header_rows: Sequence[Any]
    ) -> list[_FetchedSnapshot]:
        """Snapshot rows with their message rows; a row whose fields are unreadable is left out (logged)."""
        fetched: list[_FetchedSnapshot] = []
        for row in header_rows:
            parsed = read_or_skip(
                f'snapshot {row.seq} of run {run_id!r}', partial(rows.snapshot_header_from_row, row._mapping)
            )
            if parsed is not None:
                header, history = parsed
                found = await self._histories.fetch(connection, run_id, history)
                fetched.append(_FetchedSnapshot(header, history, found))
        return fetched

    async def _decode(self, run_id: str, fetched: _FetchedSnapshot) -> ContinuableSnapshot | None:
        """The snapshot with its messages (media restored), or `None` (logged) if they cannot be read."""

        async def decode() -> ContinuableSnapshot:
            decoded = await self._histories.decode(fetched.history, fetched.found)
            return fetched.header.model_copy(update={'messages': decoded})

        return await read_or_skip_async(f'snapshot {fetched.header.seq} of run {run_id!r}', decode)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        await self._ready()
        query = self._header_query(run_id, include_interrupted).order_by(snapshots.c.seq.desc()).limit(1)
        while True:
            async with self._db.transaction(write=False) as connection:
                row = (await self._db.execute(connection, query)).first()
                if row is None:
                    return None
                fetched = await self._fetch(connection, run_id, [row])
            for candidate in fetched:
                snapshot = await self._decode(run_id, candidate)
                if snapshot is not None:
                    return snapshot
            query = query.where(snapshots.c.seq < row.seq)

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        await self._ready()
        query = self._header_query(run_id, include_interrupted).order_by(snapshots.c.seq)
        async with self._db.transaction(write=False) as connection:
            headers = (await self._db.execute(connection, query)).all()
            fetched = await self._fetch(connection, run_id, headers)
        decoded = [await self._decode(run_id, candidate) for candidate in fetched]
        return [snapshot for snapshot in decoded if snapshot is not None]

    # --- tool effects ---

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._ready()
        async with self._db.transaction(write=True) as connection:
            await self._record_tool_effect(connection, record)

    async def _record_tool_effect(self, connection: AsyncConnection, record: ToolEffectRecord) -> None:
        values = rows.tool_effect_values(record)
        source = select(
            *(
                runs.c.run_id if name == 'run_id' else _literal(tool_effects, name, value)
                for name, value in values.items()
            )
        )
        statement = self._insert(tool_effects).from_select(list(values), source.where(runs.c.run_id == record.run_id))
        excluded = statement.excluded
        statement = statement.on_conflict_do_update(
            index_elements=[tool_effects.c.run_id, tool_effects.c.tool_call_id],
            set_={
                'tool_name': excluded.tool_name,
                'status': excluded.status,
                'started_at': excluded.started_at,
                'ended_at': excluded.ended_at,
                'idempotency_key': func.coalesce(excluded.idempotency_key, tool_effects.c.idempotency_key),
                'effect_summary': func.coalesce(excluded.effect_summary, tool_effects.c.effect_summary),
            },
        )
        if (await self._db.execute(connection, statement)).rowcount == 0:
            raise LookupError(f'run {record.run_id!r} is not registered')

    # --- batches ---

    async def write_batch(self, writes: StepWrites) -> None:
        """Apply tool effects, events and snapshots in one transaction: all of them land, or none."""
        await self._ready()
        saved: list[tuple[str, SavedHistory]] = []
        async with self._db.transaction(write=True) as connection:
            for effect in writes.tool_effects:
                await self._record_tool_effect(connection, effect)
            for event in writes.events:
                await self._append_event(connection, event)
            for snapshot in writes.snapshots:
                history = await self._save_snapshot(connection, snapshot)
                if history is not None:
                    saved.append((snapshot.run_id, history))
        for run_id, history in saved:
            self._histories.committed(run_id, history)

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        await self._ready()
        statement = select(*rows.TOOL_EFFECT_COLUMNS).where(
            tool_effects.c.run_id == run_id, tool_effects.c.tool_call_id == tool_call_id
        )
        async with self._db.transaction(write=False) as connection:
            row = (await self._db.execute(connection, statement)).first()
        if row is None:
            return None
        return read_or_skip(
            f'tool effect {tool_call_id!r} of run {run_id!r}', partial(rows.tool_effect_from_row, row._mapping)
        )

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        await self._ready()
        statement = (
            select(*rows.TOOL_EFFECT_COLUMNS)
            .where(and_(tool_effects.c.run_id == run_id, tool_effects.c.status == 'started'))
            .order_by(tool_effects.c.started_at, tool_effects.c.tool_call_id)
        )
        async with self._db.transaction(write=False) as connection:
            found = (await self._db.execute(connection, statement)).all()
        read = (
            read_or_skip(
                f'tool effect {row.tool_call_id!r} of run {run_id!r}',
                partial(rows.tool_effect_from_row, row._mapping),
            )
            for row in found
        )
        return [record for record in read if record is not None]

    # --- deletion and lifecycle ---

    async def delete_run(self, *, run_id: str) -> None:
        await self._ready()
        async with self._db.transaction(write=True) as connection:
            for table in _CHILD_TABLES:
                await self._db.execute(connection, delete(table).where(table.c.run_id == run_id))
            await self._db.execute(connection, delete(runs).where(runs.c.run_id == run_id))
        self._histories.forget(run_id)

    async def aclose(self) -> None:
        """Dispose of the engine if the store created it from a URL; never touch a caller's engine or connection."""
        await self._db.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _literal(table: Table, name: str, value: Any) -> Label[Any]:
    """`value` as a bound parameter typed like `table.<name>` (for `INSERT ... SELECT`)."""
    return literal(value, table.c[name].type).label(name)
