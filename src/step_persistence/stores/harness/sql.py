"""`HarnessSqlStore`: the tables pydantic-ai-harness's SQLite or PostgreSQL store wrote, read
(`harness+sqlite://`, `harness+postgresql://`), on an engine of its own or a caller's connection.

Its tables, as it creates them (`HarnessTables`): runs, events (numbered by `seq`), snapshots
(numbered by `seq` across runs), tool effects (one row per call), the stored messages by SHA-256
(`snapshot_messages`; PostgreSQL `<table>_messages`), the snapshots' idempotency keys, and the
blobs of its default media store (`media`; PostgreSQL `<table>_media`). On PostgreSQL every name
starts with its store's `table=` (`step_persistence` by default). A snapshot's `messages` column
holds one of three spellings, all read: the messages themselves (a JSON list, as older releases
wrote it), `{"stored_messages": n}` (SQLite: its rows in `snapshot_message_refs`, by position),
or `{"message_refs": [sha256, ...]}` (PostgreSQL).

An engine built here only reads: SQLite opens the file read-only (`mode=ro`), PostgreSQL runs
every read in a `READ ONLY` transaction. On a caller's `AsyncConnection` the reads run in the
caller's transaction (in-place adoption reads and converts in one, see `adoption.py`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from step_persistence._urls import redact_url
from step_persistence.media.protocol import MediaStore
from step_persistence.media.uri import parse_media_uri
from step_persistence.stores.harness._base import HarnessStore, Stored, StoredSnapshot
from step_persistence.stores.harness._messages import MessagesColumn

__all__ = ['DEFAULT_POSTGRES_TABLE', 'HarnessSqlStore', 'HarnessTables', 'read_only_engine']

DEFAULT_POSTGRES_TABLE = 'step_persistence'
"""The harness's `PostgresStepStore(table=...)` default: the start of each of its table names."""


@dataclass(frozen=True)
class HarnessTables:
    """The names of the harness's tables in one database."""

    runs: str
    events: str
    snapshots: str
    tool_effects: str
    messages: str
    snapshot_keys: str
    media: str
    message_refs: str | None = None
    """SQLite's `snapshot_message_refs` (PostgreSQL keeps a snapshot's references in the snapshot)."""

    @classmethod
    def sqlite(cls, *, prefix: str = '', media: str = 'media') -> HarnessTables:
        """Its SQLite store's tables (each name after `prefix`: `harness_` once adopted)."""
        return cls(
            runs=f'{prefix}runs',
            events=f'{prefix}events',
            snapshots=f'{prefix}snapshots',
            tool_effects=f'{prefix}tool_effects',
            messages=f'{prefix}snapshot_messages',
            snapshot_keys=f'{prefix}snapshot_idempotency_keys',
            media=f'{prefix}{media}',
            message_refs=f'{prefix}snapshot_message_refs',
        )

    @classmethod
    def postgres(cls, *, table: str = DEFAULT_POSTGRES_TABLE, media: str | None = None) -> HarnessTables:
        """Its PostgreSQL store's tables for `PostgresStepStore(table=table)`; `media`: its media store's table
        when it was given one of its own (`PostgresMediaStore(table=...)`)."""
        return cls(
            runs=f'{table}_runs',
            events=f'{table}_events',
            snapshots=f'{table}_snapshots',
            tool_effects=f'{table}_tool_effects',
            messages=f'{table}_messages',
            snapshot_keys=f'{table}_snapshot_keys',
            media=media or f'{table}_media',
        )

    def names(self) -> list[str]:
        """Every table, in declaration order."""
        return [value for field in fields(self) if isinstance(value := getattr(self, field.name), str)]


_RUN_COLUMNS = 'run_id, conversation_id, parent_run_id, agent_name, metadata, started_at'
_EVENT_COLUMNS = (
    'run_id, kind, step_index, timestamp, conversation_id, parent_run_id, agent_name, tool_call_id, '
    'tool_name, error, metadata, idempotency_key'
)
_EFFECT_COLUMNS = 'run_id, tool_call_id, tool_name, status, started_at, ended_at, idempotency_key, effect_summary'
_SNAPSHOT_COLUMNS = (
    'seq, run_id, step_index, conversation_id, parent_run_id, agent_name, timestamp, state, messages, idempotency_key'
)


def read_only_engine(url: URL) -> AsyncEngine:
    """An engine that only reads the database at `url`: a SQLite file opened read-only (it must exist;
    nothing is created), or PostgreSQL (through asyncpg) with every transaction `READ ONLY`."""
    if url.get_backend_name() != 'sqlite':
        return create_async_engine(
            url.set(drivername='postgresql+asyncpg'), execution_options={'postgresql_readonly': True}
        )
    import aiosqlite

    location = f'{Path(url.database or "").resolve().as_uri()}?mode=ro'

    def connect() -> Any:
        return aiosqlite.connect(location, uri=True)

    return create_async_engine('sqlite+aiosqlite://', async_creator=connect)


class HarnessSqlStore(HarnessStore):
    """The harness's tables on `bind`: an engine (each read in a transaction of its own) or a caller's
    `AsyncConnection` (reads in its transaction; it is never committed or closed).

    `HarnessSqlStore.sqlite(path)` and `HarnessSqlStore.postgres(url)` open a read-only engine of
    their own, disposed by `aclose()`. `strict`: an item that cannot be read raises instead of
    being skipped and logged.
    """

    def __init__(
        self,
        bind: AsyncEngine | AsyncConnection,
        tables: HarnessTables,
        *,
        description: str,
        owns_engine: bool = False,
        media_store: MediaStore | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(media_store=media_store, strict=strict)
        self.tables = tables
        self._bind = bind
        self._owns_engine = owns_engine
        self._description = description
        dialect = bind.dialect
        self._quote = dialect.identifier_preparer.quote
        self._registration_order = 'rowid' if dialect.name == 'sqlite' else 'started_at, run_id'

    @classmethod
    def sqlite(
        cls,
        database: str | os.PathLike[str],
        *,
        tables: HarnessTables | None = None,
        media_store: MediaStore | None = None,
    ) -> HarnessSqlStore:
        """The harness's SQLite file at `database`, opened read-only."""
        path = Path(database)
        return cls(
            read_only_engine(URL.create('sqlite', database=str(path))),
            tables or HarnessTables.sqlite(),
            description=f'the harness SQLite database {path}',
            owns_engine=True,
            media_store=media_store,
        )

    @classmethod
    def postgres(
        cls, url: str | URL, *, tables: HarnessTables | None = None, media_store: MediaStore | None = None
    ) -> HarnessSqlStore:
        """The harness's tables in the PostgreSQL database at `url` (`postgresql://...`; asyncpg is used),
        every read in a read-only transaction."""
        parsed = make_url(url).set(drivername='postgresql+asyncpg')
        return cls(
            read_only_engine(parsed),
            tables or HarnessTables.postgres(),
            description=f'the harness tables at {redact_url(parsed.render_as_string(hide_password=False))}',
            owns_engine=True,
            media_store=media_store,
        )

    @property
    def description(self) -> str:
        return self._description

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[AsyncConnection]:
        if isinstance(self._bind, AsyncConnection):
            yield self._bind
            return
        async with self._bind.connect() as connection, connection.begin():
            yield connection

    def _table(self, name: str) -> str:
        return self._quote(name)

    async def _rows(self, sql: str, **parameters: Any) -> list[Stored]:
        async with self._reading() as connection:
            result = await connection.execute(text(sql), parameters)
            return [dict(row) for row in result.mappings()]

    async def _read_runs(self) -> list[Stored]:
        return await self._rows(
            f'SELECT {_RUN_COLUMNS} FROM {self._table(self.tables.runs)} ORDER BY {self._registration_order}'
        )

    async def _read_events(self, run_id: str) -> list[Stored]:
        return await self._rows(
            f'SELECT {_EVENT_COLUMNS} FROM {self._table(self.tables.events)} WHERE run_id = :run_id ORDER BY seq',
            run_id=run_id,
        )

    async def _read_effects(self, run_id: str) -> list[Stored]:
        return await self._rows(
            f'SELECT {_EFFECT_COLUMNS} FROM {self._table(self.tables.tool_effects)} WHERE run_id = :run_id',
            run_id=run_id,
        )

    async def _read_snapshots(self, run_id: str) -> list[StoredSnapshot]:
        """The run's snapshot rows, then the references of those that keep their messages apart, then
        those messages: three queries in one transaction."""
        async with self._reading() as connection:
            result = await connection.execute(
                text(
                    f'SELECT {_SNAPSHOT_COLUMNS} FROM {self._table(self.tables.snapshots)} '
                    'WHERE run_id = :run_id ORDER BY seq'
                ),
                {'run_id': run_id},
            )
            rows = [dict(row) for row in result.mappings()]
            columns = {row['seq']: MessagesColumn.parse(row['messages']) for row in rows}
            refs = await self._refs(connection, [seq for seq, column in columns.items() if column.count is not None])
            wanted = {digest for column in columns.values() for digest in column.refs or ()}
            stored = await self._messages(connection, wanted.union(*refs.values()))
        return [StoredSnapshot(row, columns[row['seq']].resolve(stored, refs.get(row['seq']))) for row in rows]

    async def _refs(self, connection: AsyncConnection, seqs: Sequence[int]) -> dict[int, list[str]]:
        if not seqs or self.tables.message_refs is None:
            return {}
        result = await connection.execute(
            text(
                f'SELECT snapshot_seq, position, sha256 FROM {self._table(self.tables.message_refs)} '
                'WHERE snapshot_seq IN :seqs ORDER BY snapshot_seq, position'
            ).bindparams(bindparam('seqs', expanding=True)),
            {'seqs': list(seqs)},
        )
        refs: dict[int, list[str]] = {}
        for seq, _, digest in result:
            refs.setdefault(seq, []).append(digest)
        return refs

    async def _messages(self, connection: AsyncConnection, digests: set[str]) -> dict[str, str]:
        if not digests:
            return {}
        result = await connection.execute(
            text(
                f'SELECT sha256, message FROM {self._table(self.tables.messages)} WHERE sha256 IN :digests'
            ).bindparams(bindparam('digests', expanding=True)),
            {'digests': sorted(digests)},
        )
        return {digest: message for digest, message in result}

    async def _read_blob(self, uri: str) -> bytes:
        rows = await self._rows(
            f'SELECT bytes FROM {self._table(self.tables.media)} WHERE sha256 = :digest', digest=parse_media_uri(uri)
        )
        if not rows:
            raise LookupError(f'blob {uri} is not in table {self.tables.media!r}')
        return bytes(rows[0]['bytes'])

    async def aclose(self) -> None:
        if self._owns_engine and isinstance(self._bind, AsyncEngine):
            await self._bind.dispose()
