"""The PostgreSQL front doors, `PostgresStepStore` and `PostgresMediaStore` (asyncpg: `step-persistence[postgres]`).

Both open their database with `Database.for_postgres` (a URL, engine, connection or session, or an
application's asyncpg pool or connection, and an optional schema), so the two take it the same way.
"""

from __future__ import annotations

from step_persistence.media.protocol import PublicUrlResolver
from step_persistence.stores._media import DEFAULT_THRESHOLD_BYTES, MediaSetting
from step_persistence.stores.sql.database import Database, DatabaseTarget
from step_persistence.stores.sql.media_store import SqlMediaStore
from step_persistence.stores.sql.store import SqlStepStore

__all__ = ['PostgresMediaStore', 'PostgresStepStore']


class PostgresStepStore(SqlStepStore):
    """A SQL store on PostgreSQL.

    `url_or_engine` is a `postgresql://` URL (the store owns a pooled asyncpg engine, which replaces
    connections the server closed and pings those idle for over 10 s, and disposes of it in
    `aclose()`), an application's `AsyncEngine` (never
    disposed) or `AsyncConnection` (the store writes in the caller's transaction and never
    commits, rolls back or closes it).

    An application on raw asyncpg passes its `asyncpg.Pool` or `asyncpg.Connection` instead (see
    `stores/sql/borrowed_asyncpg.py`). A pool lends the store a connection for each operation,
    which commits, and gets it back when the operation ends. A connection is shared: outside a
    transaction each operation commits; while the caller has one open, each operation is a
    savepoint of it, so the caller's commit keeps the store's writes and its rollback undoes them
    (the store never commits, rolls back or ends the caller's transaction). `aclose()` closes
    neither, and the store installs no type codec on them: the caller's queries decode JSON as
    before. A pool or connection with `json` or `jsonb` codecs of its own is refused (`TypeError`).

    `schema` puts the tables and the migration version table in that PostgreSQL schema (created
    if missing, by the first write or `migrate()`; reading never creates or migrates anything),
    beside an application's own tables. Creating or upgrading the schema takes a
    transaction-level advisory lock, so several processes may start at once. `table_prefix` starts
    every name of the store's schema with it, as for `SqlStepStore`.
    """

    def __init__(
        self,
        url_or_engine: DatabaseTarget,
        schema: str | None = None,
        *,
        table_prefix: str = '',
        auto_migrate: bool = True,
        max_snapshots_per_run: int | None = None,
        media_store: MediaSetting = 'auto',
        media_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
    ) -> None:
        self._start(
            Database.for_postgres(url_or_engine, schema=schema, table_prefix=table_prefix, owner='PostgresStepStore'),
            auto_migrate=auto_migrate,
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
        )


class PostgresMediaStore(SqlMediaStore):
    """A SQL media store on PostgreSQL (asyncpg): a `postgresql://` URL, an `AsyncEngine`, an
    `AsyncConnection`, or an application's `asyncpg.Pool` or `asyncpg.Connection`, and an optional
    schema, as for `PostgresStepStore`; `table=` keeps the blobs in a table of that name (see
    `SqlMediaStore`)."""

    def __init__(
        self,
        url_or_engine: DatabaseTarget,
        schema: str | None = None,
        *,
        table_prefix: str = '',
        table: str | None = None,
        auto_migrate: bool = True,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        self._start(
            Database.for_postgres(url_or_engine, schema=schema, table_prefix=table_prefix, owner='PostgresMediaStore'),
            auto_migrate=auto_migrate,
            public_url=public_url,
            table=table,
        )
