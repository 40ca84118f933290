"""`SqlStepStore`: the `StepStore` protocol on SQLite or PostgreSQL, through one SQLAlchemy schema.

Every operation is one transaction on one connection, made of Core statements. Uniqueness
(runs, event and snapshot idempotency keys, tool-effect keys, messages) is enforced by
constraints with `INSERT ... ON CONFLICT`, never by reading first. Snapshot sequence numbers and
message numbers come from the run's row (`UPDATE runs ... RETURNING`), which also serializes
concurrent snapshot writers of one run, across processes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Literal, Self

from sqlalchemy import Table, Text, and_, cast, delete, func, literal, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import Label

from step_persistence._history import EncodedMessage, decode_messages, pack_refs, unpack_refs
from step_persistence._reading import read_or_skip
from step_persistence.media.protocol import MediaStore
from step_persistence.records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
from step_persistence.retention import retained_seqs, validate_max_snapshots
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.dialects import dialect_insert
from step_persistence.stores.sql.message_numbers import MessageNumbers
from step_persistence.stores.sql.migrate import upgrade
from step_persistence.stores.sql.schema import events, messages, runs, snapshot_keys, snapshots, tool_effects

__all__ = ['DEFAULT_MEDIA_THRESHOLD_BYTES', 'SqlStepStore']

DEFAULT_MEDIA_THRESHOLD_BYTES = 64 * 1024

_CHILD_TABLES = (events, messages, snapshots, snapshot_keys, tool_effects)
_IN_CHUNK = 1000
"""Largest number of values bound into one `IN (...)` list."""


class _StaleMessageNumbers(Exception):
    """The cached message numbers belong to an earlier run registered under the same run id."""


def _check_media(media_store: object, media_threshold_bytes: object) -> int:
    if not (media_store is None or media_store == 'auto' or isinstance(media_store, MediaStore)):
        raise ValueError(f"media_store must be 'auto', None or a MediaStore, got {media_store!r}")
    if (
        isinstance(media_threshold_bytes, bool)
        or not isinstance(media_threshold_bytes, int)
        or media_threshold_bytes < 1
    ):
        raise ValueError(f'media_threshold_bytes must be an int >= 1, got {media_threshold_bytes!r}')
    return media_threshold_bytes


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
    `media_store` (`'auto'`: the database's `media` table) and `media_threshold_bytes` configure
    where large message parts go; messages are stored inline for now.
    """

    def __init__(
        self,
        target: str | URL | AsyncEngine | AsyncConnection | Database,
        *,
        schema: str | None = None,
        auto_migrate: bool = True,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
    ) -> None:
        self.max_snapshots_per_run = validate_max_snapshots(max_snapshots_per_run)
        self.media_threshold_bytes = _check_media(media_store, media_threshold_bytes)
        self.media_store = media_store
        if isinstance(target, Database):
            if schema is not None:
                raise TypeError('pass the schema to the Database, not to the store')
            self._db = target
        elif isinstance(target, AsyncEngine):
            self._db = Database.from_engine(target, schema=schema)
        elif isinstance(target, AsyncConnection):
            self._db = Database.from_connection(target, schema=schema)
        elif isinstance(target, str | URL):
            self._db = Database.from_url(target, schema=schema)
        else:
            raise TypeError(
                f'SqlStepStore takes a database URL, an AsyncEngine or an AsyncConnection, got {type(target).__name__}'
            )
        self._auto_migrate = auto_migrate
        self._migrated = False
        self._migrating = asyncio.Lock()
        self._insert = dialect_insert(self._db.dialect_name)
        self._numbers = None if self._db.in_caller_transaction else MessageNumbers()
        """Committed message numbers per run; not kept when the caller owns the transaction."""

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self._db.description})'

    # --- plumbing ---

    async def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (what `auto_migrate` does on first use)."""
        await upgrade(self._db)
        self._migrated = True

    async def _ready(self) -> None:
        if self._migrated or not self._auto_migrate:
            return
        async with self._migrating:
            if not self._migrated:
                await self.migrate()

    async def _execute(self, connection: AsyncConnection, statement: Executable, parameters: Any = None) -> Any:
        return await connection.execute(statement, parameters, execution_options=self._db.execution_options)

    async def _run_exists(self, connection: AsyncConnection, run_id: str) -> bool:
        result = await self._execute(connection, select(runs.c.id).where(runs.c.run_id == run_id))
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
            inserted = (await self._execute(connection, statement)).first()
        if inserted is None:
            raise ValueError(f'run {record.run_id!r} is already registered')

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        await self._ready()
        async with self._db.transaction(write=False) as connection:
            row = (await self._execute(connection, select(*rows.RUN_COLUMNS).where(runs.c.run_id == run_id))).first()
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
            found = (await self._execute(connection, statement)).all()
        records = (read_or_skip(f'run {row.run_id!r}', partial(rows.run_from_row, row._mapping)) for row in found)
        return [record for record in records if record is not None]

    # --- events ---

    async def append_event(self, event: StepEvent) -> None:
        await self._ready()
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
        async with self._db.transaction(write=True) as connection:
            written = (await self._execute(connection, statement)).rowcount
            if written == 0 and not await self._run_exists(connection, event.run_id):
                raise LookupError(f'run {event.run_id!r} is not registered')

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        await self._ready()
        statement = select(events.c.id, *rows.EVENT_COLUMNS).where(events.c.run_id == run_id).order_by(events.c.id)
        async with self._db.transaction(write=False) as connection:
            found = (await self._execute(connection, statement)).all()
        read = (
            read_or_skip(f'event {row.id} of run {run_id!r}', partial(rows.event_from_row, row._mapping))
            for row in found
        )
        return [event for event in read if event is not None]

    # --- snapshots ---

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._ready()
        try:
            await self._save_snapshot(snapshot, use_cache=True)
        except _StaleMessageNumbers:
            await self._save_snapshot(snapshot, use_cache=False)

    async def _save_snapshot(self, snapshot: ContinuableSnapshot, *, use_cache: bool) -> None:
        run_id = snapshot.run_id
        encoded = snapshot.encoded_messages()
        distinct = list({message.digest: message for message in encoded}.values())
        known = self._numbers.get(run_id) if self._numbers is not None and use_cache else None
        async with self._db.transaction(write=True) as connection:
            if snapshot.idempotency_key is not None and not await self._claim_snapshot_key(connection, snapshot):
                return
            if known is None:
                stored = await self._stored_numbers(connection, run_id, [message.digest for message in distinct])
            else:
                stored = known.numbers
            fresh = [message for message in distinct if message.digest not in stored]
            allocated = (
                await self._execute(
                    connection,
                    update(runs)
                    .where(runs.c.run_id == run_id)
                    .values(
                        last_snapshot_seq=runs.c.last_snapshot_seq + 1,
                        last_message_no=runs.c.last_message_no + len(fresh),
                    )
                    .returning(runs.c.id, runs.c.last_snapshot_seq, runs.c.last_message_no),
                )
            ).first()
            if allocated is None:
                raise LookupError(f'run {run_id!r} is not registered')
            run_pk, seq, last_no = allocated
            if known is not None and known.run_pk != run_pk:
                raise _StaleMessageNumbers
            added = await self._store_messages(connection, run_id, fresh, first_no=last_no - len(fresh) + 1)
            refs = pack_refs([added[m.digest] if m.digest in added else stored[m.digest] for m in encoded])
            await self._execute(
                connection, snapshots.insert().values(rows.snapshot_values(snapshot, seq=seq, message_refs=refs))
            )
            if self.max_snapshots_per_run is not None:
                await self._prune(connection, run_id, self.max_snapshots_per_run)
        if self._numbers is not None:
            self._numbers.remember(run_id, run_pk, added if known is not None else {**stored, **added})

    async def _claim_snapshot_key(self, connection: AsyncConnection, snapshot: ContinuableSnapshot) -> bool:
        """Record the snapshot's idempotency key; `False` if the run already used it."""
        source = select(runs.c.run_id, _literal(snapshot_keys, 'idempotency_key', snapshot.idempotency_key))
        statement = (
            self._insert(snapshot_keys)
            .from_select(['run_id', 'idempotency_key'], source.where(runs.c.run_id == snapshot.run_id))
            .on_conflict_do_nothing(index_elements=[snapshot_keys.c.run_id, snapshot_keys.c.idempotency_key])
        )
        if (await self._execute(connection, statement)).rowcount:
            return True
        if not await self._run_exists(connection, snapshot.run_id):
            raise LookupError(f'run {snapshot.run_id!r} is not registered')
        return False

    async def _store_messages(
        self, connection: AsyncConnection, run_id: str, fresh: list[EncodedMessage], *, first_no: int
    ) -> dict[str, int]:
        """Insert the messages not known to be stored, numbered from `first_no`; return every one's number.

        A message another writer stored meanwhile keeps that writer's number.
        """
        if not fresh:
            return {}
        values = [
            {'run_id': run_id, 'no': first_no + offset, 'digest': message.digest, 'body': body}
            for offset, (message, body) in enumerate(zip(fresh, self._bodies_to_store(fresh), strict=True))
        ]
        statement = (
            self._insert(messages)
            .on_conflict_do_nothing(index_elements=[messages.c.run_id, messages.c.digest])
            .returning(messages.c.digest, messages.c.no)
        )
        numbers: dict[str, int] = {digest: no for digest, no in await self._execute(connection, statement, values)}
        missing = [message.digest for message in fresh if message.digest not in numbers]
        return {**numbers, **await self._stored_numbers(connection, run_id, missing)}

    async def _stored_numbers(self, connection: AsyncConnection, run_id: str, digests: Sequence[str]) -> dict[str, int]:
        """The numbers of those of `digests` that the run has stored."""
        numbers: dict[str, int] = {}
        for start in range(0, len(digests), _IN_CHUNK):
            statement = select(messages.c.digest, messages.c.no).where(
                messages.c.run_id == run_id, messages.c.digest.in_(digests[start : start + _IN_CHUNK])
            )
            numbers.update({digest: no for digest, no in await self._execute(connection, statement)})
        return numbers

    def _bodies_to_store(self, fresh: Sequence[EncodedMessage]) -> list[bytes]:
        """The JSON written to `messages.body` for each new message.

        This is where media externalization plugs in: large parts will be moved to the media
        store and replaced by markers here, and `_trees_read` will restore them.
        """
        return [message.data for message in fresh]

    def _trees_read(self, bodies: Sequence[str]) -> list[Any]:
        """JSON trees of stored message bodies (the inverse of `_bodies_to_store`)."""
        return [json.loads(body) for body in bodies]

    def _with_messages(
        self, header: ContinuableSnapshot, numbers: list[int], bodies: Mapping[int, str]
    ) -> ContinuableSnapshot:
        """`header` with its messages; `KeyError`/`ValueError` when one is missing or malformed."""
        trees = self._trees_read([bodies[number] for number in numbers])
        return header.model_copy(update={'messages': decode_messages(trees)})

    async def _prune(self, connection: AsyncConnection, run_id: str, max_snapshots: int) -> None:
        stored = select(snapshots.c.seq, snapshots.c.state).where(snapshots.c.run_id == run_id)
        keep = retained_seqs([(seq, state) for seq, state in await self._execute(connection, stored)], max_snapshots)
        await self._execute(
            connection, delete(snapshots).where(snapshots.c.run_id == run_id, snapshots.c.seq.not_in(keep))
        )

    def _header_query(self, run_id: str, include_interrupted: bool) -> Any:
        statement = select(*rows.SNAPSHOT_HEADER_COLUMNS).where(snapshots.c.run_id == run_id)
        return statement if include_interrupted else statement.where(snapshots.c.state == 'complete')

    async def _materialize(
        self, connection: AsyncConnection, run_id: str, headers: Sequence[Any]
    ) -> list[ContinuableSnapshot]:
        """Snapshots for header rows, in order, leaving out (and logging) any that cannot be read."""
        parsed: list[tuple[ContinuableSnapshot, list[int]]] = []
        for row in headers:
            header = read_or_skip(f'snapshot {row.seq} of run {run_id!r}', partial(_parse_header, row._mapping))
            if header is not None:
                parsed.append(header)
        wanted = {number for _, numbers in parsed for number in numbers}
        bodies: dict[int, str] = {}
        if wanted:
            statement = select(messages.c.no, cast(messages.c.body, Text)).where(
                messages.c.run_id == run_id, messages.c.no.between(min(wanted), max(wanted))
            )
            bodies = {no: body for no, body in await self._execute(connection, statement)}
        snapshots_read = (
            read_or_skip(
                f'snapshot {header.seq} of run {run_id!r}', partial(self._with_messages, header, numbers, bodies)
            )
            for header, numbers in parsed
        )
        return [snapshot for snapshot in snapshots_read if snapshot is not None]

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        await self._ready()
        query = self._header_query(run_id, include_interrupted).order_by(snapshots.c.seq.desc()).limit(1)
        async with self._db.transaction(write=False) as connection:
            while True:
                row = (await self._execute(connection, query)).first()
                if row is None:
                    return None
                read = await self._materialize(connection, run_id, [row])
                if read:
                    return read[0]
                query = query.where(snapshots.c.seq < row.seq)

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        await self._ready()
        query = self._header_query(run_id, include_interrupted).order_by(snapshots.c.seq)
        async with self._db.transaction(write=False) as connection:
            headers = (await self._execute(connection, query)).all()
            return await self._materialize(connection, run_id, headers)

    # --- tool effects ---

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._ready()
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
        async with self._db.transaction(write=True) as connection:
            if (await self._execute(connection, statement)).rowcount == 0:
                raise LookupError(f'run {record.run_id!r} is not registered')

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        await self._ready()
        statement = select(*rows.TOOL_EFFECT_COLUMNS).where(
            tool_effects.c.run_id == run_id, tool_effects.c.tool_call_id == tool_call_id
        )
        async with self._db.transaction(write=False) as connection:
            row = (await self._execute(connection, statement)).first()
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
            found = (await self._execute(connection, statement)).all()
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
                await self._execute(connection, delete(table).where(table.c.run_id == run_id))
            await self._execute(connection, delete(runs).where(runs.c.run_id == run_id))
        if self._numbers is not None:
            self._numbers.forget(run_id)

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


def _parse_header(row: Any) -> tuple[ContinuableSnapshot, list[int]]:
    header, refs = rows.snapshot_header_from_row(row)
    return header, unpack_refs(refs)
