"""`PostgresStepStore`: the SQL store on PostgreSQL through asyncpg (extra `step-persistence[postgres]`)."""

from __future__ import annotations

from typing import Literal

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from step_persistence.media.protocol import MediaStore
from step_persistence.stores.sql.dialects import redact, resolve_url
from step_persistence.stores.sql.store import DEFAULT_MEDIA_THRESHOLD_BYTES, SqlStepStore

__all__ = ['PostgresStepStore']


class PostgresStepStore(SqlStepStore):
    """A SQL store on PostgreSQL.

    `url_or_engine` is a `postgresql://` URL (the store owns a pooled asyncpg engine with
    `pool_pre_ping` and disposes of it in `aclose()`), an application's `AsyncEngine` (never
    disposed) or `AsyncConnection` (the store writes in the caller's transaction and never
    commits, rolls back or closes it).

    `schema` puts the tables and the migration version table in that PostgreSQL schema (created
    if missing), beside an application's own tables. Creating or upgrading the schema takes a
    transaction-level advisory lock, so several processes may start at once.
    """

    def __init__(
        self,
        url_or_engine: str | URL | AsyncEngine | AsyncConnection,
        schema: str | None = None,
        *,
        auto_migrate: bool = True,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
    ) -> None:
        if isinstance(url_or_engine, AsyncEngine | AsyncConnection):
            dialect = url_or_engine.dialect.name
        else:
            url = resolve_url(url_or_engine)
            dialect = url.get_backend_name()
            url_or_engine = url
        if dialect != 'postgresql':
            where = redact(url_or_engine) if isinstance(url_or_engine, URL) else f'a {dialect} engine'
            raise ValueError(f'PostgresStepStore needs a PostgreSQL database, got {where}')
        super().__init__(
            url_or_engine,
            schema=schema,
            auto_migrate=auto_migrate,
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
        )
