"""A caller's asyncpg pool or connection as a store's engine, for an application on raw asyncpg.

`asyncpg_engine` builds an `AsyncEngine` over either:

- an `asyncpg.Pool`: each operation acquires a connection from the pool and releases it back
  when the operation ends (SQLAlchemy's `NullPool`: between operations the store holds none of
  the application's connections). Disposing of the engine leaves the pool open.
- an `asyncpg.Connection` (one acquired from a pool too): the store's only connection, shared
  with the caller and never closed. Outside a transaction, each operation runs in a transaction
  of its own, which the store commits. While the caller has a transaction open
  (`connection.is_in_transaction()`: begun with `connection.transaction()` or a `BEGIN`), each
  operation runs in a savepoint of it, released when the operation succeeds and rolled back to
  when it fails: the caller's commit keeps the store's writes, its rollback undoes them, and the
  store never commits, rolls back or ends the caller's transaction. An operation runs to its end
  even if its caller is cancelled (`UninterruptibleExecutor`).

The caller's type codecs stay as they are. SQLAlchemy's asyncpg dialect installs `json` and
`jsonb` codecs of its own (`set_type_codec`) on each connection it opens, which would change
what the application's own queries return for JSON from then on (asyncpg's default: the text);
asyncpg cannot hand back a codec once replaced, so it could not be restored either. These
engines use `BorrowedAsyncpgDialect`, which installs none and decodes the store's JSON columns
from asyncpg's default text itself. A pool or connection that decodes `json` or `jsonb` with a
codec of the application's (`set_type_codec`, in a pool's `init` for instance) is refused by the
store's first operation (`TypeError`): the store's JSON text would go through the application's
encoder and be stored as a JSON string. That is checked once per pool or connection, by one query.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.pool import NullPool, StaticPool

from step_persistence._cancellation import run_to_completion
from step_persistence.stores.sql.executors import Executor, Operation
from step_persistence.stores.sql.prepared import Prepared

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    'AsyncpgTarget',
    'BorrowedAsyncpgDialect',
    'UninterruptibleExecutor',
    'asyncpg_engine',
    'describe',
    'is_pool',
]

T = TypeVar('T')

AsyncpgTarget = Any
"""An `asyncpg.Pool` or `asyncpg.Connection` (asyncpg has no type information for mypy)."""

_DRIVER = 'step_persistence_asyncpg'
"""The driver name of the URL of these engines, registered with SQLAlchemy for `BorrowedAsyncpgDialect`."""

_JSON_PROBE = "SELECT '[]'::json, '[]'::jsonb"
"""What a connection with asyncpg's default codecs returns as `('[]', '[]')`."""


def describe(target: AsyncpgTarget) -> str:
    """How a store's repr and errors name `target`."""
    return 'an asyncpg pool' if is_pool(target) else 'an asyncpg connection'


def is_pool(target: AsyncpgTarget) -> bool:
    return isinstance(target, asyncpg.Pool)


class BorrowedAsyncpgDialect(PGDialect_asyncpg):
    """SQLAlchemy's asyncpg dialect without its `json` and `jsonb` codecs: JSON columns decode asyncpg's text.

    Writing is unchanged (SQLAlchemy's JSON types bind JSON text, which asyncpg's default codecs
    send as it is); reading parses the text SQLAlchemy's way (`json.loads`, or the engine's
    `json_deserializer`).
    """

    supports_native_json_deserialization = False
    supports_statement_cache = True

    async def setup_asyncpg_json_codec(self, conn: Any) -> None:
        """Install nothing: the connection is the application's."""

    async def setup_asyncpg_jsonb_codec(self, conn: Any) -> None:
        """Install nothing: the connection is the application's."""


registry.register(f'postgresql.{_DRIVER}', __name__, 'BorrowedAsyncpgDialect')


def asyncpg_engine(target: AsyncpgTarget) -> AsyncEngine:
    """An engine on an application's `asyncpg.Pool` or `asyncpg.Connection` (see the module's docstring).

    Disposing of it closes nothing of the application's: pooled connections go back to their pool,
    a connection stays open.
    """
    from sqlalchemy.ext.asyncio import create_async_engine

    source = _Source(target)
    return create_async_engine(
        f'postgresql+{_DRIVER}://',
        async_creator=source.connect,
        poolclass=NullPool if is_pool(target) else StaticPool,
    )


class _Source:
    """Where an engine's connections come from: acquired from a pool (given back), or the one connection."""

    def __init__(self, target: AsyncpgTarget) -> None:
        self._target = target
        self._checked = False
        """Whether the target's `json` and `jsonb` codecs were found to be asyncpg's defaults."""

    async def connect(self) -> _Lent:
        if is_pool(self._target):
            pool = self._target
            connection = await pool.acquire()
            lent = _Lent(connection, give_back=lambda timeout: pool.release(connection, timeout=timeout))
        else:
            lent = _Lent(self._target, give_back=None)
        if not self._checked:
            try:
                await self._check_codecs(lent)
            except BaseException:
                await lent.close()
                raise
            self._checked = True
        return lent

    async def _check_codecs(self, lent: _Lent) -> None:
        row = await lent.fetchrow(_JSON_PROBE)
        if tuple(row) != ('[]', '[]'):
            raise TypeError(
                f'{describe(self._target)} decodes json or jsonb with a codec of its own (set_type_codec): the '
                "store writes JSON as text through asyncpg's default codecs and would store it through yours as "
                'a JSON string; give the store a pool or connection without JSON codecs (or a URL)'
            )


class _Lent:
    """An application's asyncpg connection as the store's engine sees it.

    Everything is the connection's, except `transaction()` (on the caller's own connection a
    `_Scope`: a transaction of the store's, or a savepoint while the caller has one open),
    `close()` (a pool's connection goes back to its pool; the caller's own stays open) and
    `terminate()` (only a pool's broken connection is ended: its pool connects afresh).
    """

    __slots__ = ('_connection', '_give_back')

    def __init__(
        self, connection: AsyncpgTarget, *, give_back: Callable[[float | None], Awaitable[None]] | None
    ) -> None:
        self._connection = connection
        self._give_back = give_back

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def transaction(self, **options: Any) -> Any:
        """The transaction of one store operation (the dialect's `options` are asyncpg's defaults)."""
        if self._give_back is not None:
            return self._connection.transaction(**options)
        return _Scope(self._connection, savepoint=self._connection.is_in_transaction())

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (asyncpg's signature: the dialect passes one)
        """Give a pool's connection back to its pool; leave the caller's own open."""
        if self._give_back is not None:
            await self._give_back(timeout)

    def terminate(self) -> None:
        """End a pool's connection that broke (its pool connects afresh); leave the caller's own to the caller."""
        if self._give_back is not None:
            self._connection.terminate()


_SAVEPOINTS = itertools.count(1)
"""Numbers the store's savepoints, so that none shadows another's (the caller's named their own way)."""


class _Scope:
    """One store operation's transaction on the caller's own connection, driven as an asyncpg `Transaction`.

    Outside a transaction of the caller's: `BEGIN`, then `COMMIT` or `ROLLBACK`. Inside one: a
    savepoint, released, or rolled back to and released. Issued as statements rather than through
    asyncpg's nested `transaction()`, which refuses a transaction the caller began with `BEGIN`.
    """

    def __init__(self, connection: AsyncpgTarget, *, savepoint: bool) -> None:
        self._connection = connection
        if savepoint:
            name = f'step_persistence_{next(_SAVEPOINTS)}'
            self._statements = (
                f'SAVEPOINT {name}',
                f'RELEASE SAVEPOINT {name}',
                f'ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}',
            )
        else:
            self._statements = ('BEGIN', 'COMMIT', 'ROLLBACK')

    async def start(self) -> None:
        await self._connection.execute(self._statements[0])

    async def commit(self) -> None:
        await self._connection.execute(self._statements[1])

    async def rollback(self) -> None:
        await self._connection.execute(self._statements[2])


class UninterruptibleExecutor:
    """Operations on the caller's own connection, each run to its end even if its caller is cancelled.

    A cancellation that interrupted a statement would leave the caller's connection inside the
    store's transaction, or the caller's transaction aborted by half an operation: asyncpg is still
    cancelling the statement when the rollback is sent, and refuses it. So a cancelled caller waits
    for the operation to commit or roll back (as on the store's own SQLite engines), then sees its
    cancellation. A statement timeout (the connection's `command_timeout`) still ends a statement.
    """

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    async def run(self, operation: Operation[T], **options: Any) -> T:
        """`operation` as the wrapped executor runs it (`options` are its own), awaited to its end."""
        return await run_to_completion(self._executor.run(operation, **options))

    async def run_statement(self, statement: Prepared, parameters: Mapping[str, Any], **options: Any) -> Any:
        """`statement` as the wrapped executor runs it (`options` are its own), awaited to its end."""
        return await run_to_completion(self._executor.run_statement(statement, parameters, **options))

    def follow_loop(self) -> None:
        self._executor.follow_loop()

    async def dispose(self) -> None:
        await self._executor.dispose()
