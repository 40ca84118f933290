"""How a store operation reaches the database: one synchronous function, run in one transaction.

Every operation of the SQL stores is written once, as a function of a `Transaction` (a
synchronous SQLAlchemy `Connection` inside a transaction). An executor runs it:

- `ThreadExecutor` (SQLite, on a synchronous engine): the whole transaction (pool checkout,
  `BEGIN [IMMEDIATE]`, every statement, `COMMIT`, check-in) runs in one call to another thread,
  so an operation costs the event loop one wake-up. Writes go to the engine's writer thread
  (`sqlite_writer.py`: SQLite admits one writer at a time, so the process's writes queue there,
  and those queued together share a transaction) rather than into SQLite's busy handler; reads
  run on the executor's own thread pool, so media stores or other
  stores using threads cannot starve it. A database with a single connection (`:memory:`, a
  caller's `sqlite3` connection) runs every operation on the writer thread.
- `AsyncExecutor` (PostgreSQL through asyncpg, and any application's `AsyncEngine`,
  `AsyncConnection` or `AsyncSession`): on an engine, the whole transaction (checkout, `BEGIN`,
  the function, `COMMIT`, check-in) runs on the engine's synchronous facade in one greenlet
  (`sqlalchemy.util.greenlet_spawn`, what `AsyncConnection.run_sync` uses); an operation that is one
  statement (`one_statement`) runs there in autocommit instead, its own transaction in one round
  trip (`run_statement` on the store's own engine: straight on a pooled DBAPI connection, without a
  SQLAlchemy `Connection`, its autocommit restored before check-in); on a caller's
  connection, the function runs through `run_sync` inside the caller's transaction (never
  committed, rolled back or closed here); on a caller's session, on the connection of the
  session's current transaction (`await session.connection()`, which begins one if none is
  open), the same way. An application's engine may be asyncpg or psycopg 3: on it every
  statement runs through Core. On SQLite (aiosqlite) a cancelled caller waits for
  its operation to finish, as a thread cannot be interrupted either: aiosqlite's connections
  do not survive an interrupted statement (SQLAlchemy closes them, and that close can leave a
  task the event loop waits for forever at shutdown).

A function that raises rolls its transaction back (except the caller's: that is the caller's).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection, StaticPool
from sqlalchemy.sql import Executable
from sqlalchemy.util import greenlet_spawn

from step_persistence._cancellation import run_to_completion
from step_persistence.stores.sql.naming import DEFAULT_NAMES, TableNames
from step_persistence.stores.sql.prepared import DriverResult, Prepared
from step_persistence.stores.sql.sqlite_writer import SqliteWriter

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
    from typing_extensions import TypeIs

__all__ = ['AsyncBind', 'AsyncExecutor', 'Executor', 'ThreadExecutor', 'Transaction', 'is_async_bind']

T = TypeVar('T')

AsyncBind: TypeAlias = 'AsyncEngine | AsyncConnection | AsyncSession'
"""An application's engine, connection or session (SQLAlchemy's asyncio extension)."""


def is_async_bind(value: object) -> TypeIs[AsyncBind]:
    """Whether `value` is an `AsyncEngine`, an `AsyncConnection` or an `AsyncSession`.

    None exists before `sqlalchemy.ext.asyncio` is imported, so it is looked up rather than imported:
    a store on a SQLite URL or a `sqlite3` connection never loads the extension, nor the ORM it imports.
    """
    extension = sys.modules.get('sqlalchemy.ext.asyncio')
    return extension is not None and isinstance(
        value, extension.AsyncEngine | extension.AsyncConnection | extension.AsyncSession
    )


_PRESERVE_ROWCOUNT: Mapping[str, Any] = {'preserve_rowcount': True}
"""Every statement keeps its row count after its cursor closes: the store counts the rows an `INSERT ... SELECT`
wrote (0: the run is not registered), and psycopg 3's cursor forgets it when SQLAlchemy closes a result
without rows (asyncpg's and sqlite3's do not)."""


@dataclass(frozen=True, slots=True)
class Transaction:
    """A synchronous connection inside one operation's transaction, and the options of every statement."""

    connection: Connection
    options: Mapping[str, Any]
    """Execution options for each statement (a PostgreSQL schema's `schema_translate_map`, and
    `preserve_rowcount`)."""
    driver: Any = None
    """The DBAPI connection under `connection`, when `Prepared` statements may run on it directly."""
    names: TableNames = DEFAULT_NAMES
    """The names of the store's tables in this database: every statement is translated onto them."""

    def execute(self, statement: Executable | Prepared, parameters: Any = None) -> Any:
        """Run `statement` (with `parameters`: a dict, or a list of dicts for many rows); its result.

        The result is a `CursorResult`, or for a `Prepared` statement run on the driver a
        `DriverResult`: either way `rowcount`, `first()`, `all()` and iteration over plain rows.
        """
        statement = self.names.translate(statement)
        if isinstance(statement, Prepared):
            if self.driver is not None:
                result = _on_driver(statement, self.driver, self.connection.dialect, parameters, self.connection)
                if result is not None:
                    return result
            statement = statement.statement
        return self.connection.execute(statement, parameters, execution_options=self.options)


Operation = Callable[[Transaction], T]


def _on_driver(
    statement: Prepared, driver: Any, dialect: Dialect, parameters: Any, owner: Connection | PoolProxiedConnection
) -> DriverResult | None:
    """`statement` run on the DBAPI connection `driver` (`None`: it does not qualify, nothing ran); a
    disconnection invalidates `owner` (its `Connection` or pooled connection), as Core does, so the pool
    drops it."""
    try:
        return statement.run(driver, dialect, parameters)
    except DBAPIError as error:
        orig: Any = error.orig
        if dialect.is_disconnect(orig, driver, None):
            error.connection_invalidated = True
            owner.invalidate(orig)
        raise


def _first_row(statement: Prepared, parameters: Mapping[str, Any], transaction: Transaction) -> Any:
    return transaction.execute(statement, parameters).first()


class Executor(Protocol):
    """Runs operations in transactions of one database."""

    async def run(
        self,
        operation: Operation[T],
        *,
        write: bool,
        options: Mapping[str, Any],
        names: TableNames = DEFAULT_NAMES,
        one_statement: bool = False,
    ) -> T:
        """`operation` in one transaction (writing: SQLite `BEGIN IMMEDIATE`), committed if it returns, its
        statements run with `options` on the tables `names` names. With `one_statement` (an operation that
        executes a single statement, atomic by itself), an executor may run it in autocommit: no `BEGIN` or
        `COMMIT` of its own."""
        ...

    async def run_statement(
        self,
        statement: Prepared,
        parameters: Mapping[str, Any],
        *,
        options: Mapping[str, Any],
        names: TableNames = DEFAULT_NAMES,
        autocommit: bool,
    ) -> Any:
        """The first row of `statement`, one write that is atomic by itself, executed with `parameters` as an
        operation of its own (`autocommit`: with no `BEGIN` or `COMMIT` of its own where the executor can,
        as `run(..., one_statement=True)`)."""
        ...

    def follow_loop(self) -> None:
        """Operations run on another event loop from now on (the previous one is done or idle)."""
        ...

    async def dispose(self) -> None:
        """Close the engine's pooled connections."""
        ...


class ThreadExecutor:
    """Whole transactions on a synchronous SQLite engine: writes on its writer thread, reads on worker threads."""

    def __init__(self, engine: Engine, *, threads: int) -> None:
        self._engine = engine
        self._writer = SqliteWriter(engine)
        self._thread_count = threads
        self._threads = self._new_threads()
        self._single_connection = isinstance(engine.pool, StaticPool)
        """With one connection to share, reads go through the writer thread too."""

    async def run(
        self,
        operation: Operation[T],
        *,
        write: bool,
        options: Mapping[str, Any],
        names: TableNames = DEFAULT_NAMES,
        one_statement: bool = False,
    ) -> T:
        if write or self._single_connection:
            return await self._writer.run(partial(_with_transaction, operation, options, names=names), write=write)
        return await self._on_a_thread(partial(_in_transaction, self._engine, operation, options, names=names))

    async def run_statement(
        self,
        statement: Prepared,
        parameters: Mapping[str, Any],
        *,
        options: Mapping[str, Any],
        names: TableNames = DEFAULT_NAMES,
        autocommit: bool,
    ) -> Any:
        return await self.run(partial(_first_row, statement, parameters), write=True, options=options, names=names)

    def _new_threads(self) -> ThreadPoolExecutor:
        """The read threads (started as reads need them, at most `threads` at once)."""
        return ThreadPoolExecutor(self._thread_count, thread_name_prefix='step-persistence-sqlite-read')

    async def _on_a_thread(self, function: Callable[[], T]) -> T:
        """`function`'s result, run on one of the executor's threads in a copy of the caller's context; the
        thread hands the outcome back with one wake-up of the event loop. A cancelled caller waits for
        `function` to end, as a thread cannot be interrupted (`run_to_completion`)."""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()

        def work() -> None:
            try:
                result = context.run(function)
            except BaseException as error:  # handed to the caller, whatever it is
                loop.call_soon_threadsafe(_fail, outcome, error)
            else:
                loop.call_soon_threadsafe(_succeed, outcome, result)

        self._threads.submit(work)
        return await run_to_completion(outcome)

    def follow_loop(self) -> None:
        """Nothing to do: the connections live on threads, not on a loop."""

    async def dispose(self) -> None:
        await self._on_a_thread(self._writer.stop)
        await self._on_a_thread(self._engine.dispose)
        threads, self._threads = self._threads, self._new_threads()
        threads.shutdown()  # its threads are idle: they end at once, and none is left behind


def _succeed(outcome: asyncio.Future[T], result: T) -> None:
    if not outcome.done():
        outcome.set_result(result)


def _fail(outcome: asyncio.Future[Any], error: BaseException) -> None:
    if not outcome.done():
        outcome.set_exception(error)


def _with_transaction(
    operation: Operation[T],
    options: Mapping[str, Any],
    connection: Connection,
    *,
    direct: bool = True,
    names: TableNames = DEFAULT_NAMES,
) -> T:
    """`operation` on `connection`, already in its transaction; with `direct` (and no options), `Prepared`
    statements run on the DBAPI connection."""
    driver = connection.connection.dbapi_connection if direct and not options else None
    return operation(Transaction(connection, {**options, **_PRESERVE_ROWCOUNT}, driver, names))


def _in_transaction(
    engine: Engine,
    operation: Operation[T],
    options: Mapping[str, Any],
    *,
    direct: bool = True,
    names: TableNames = DEFAULT_NAMES,
) -> T:
    with engine.connect() as connection, connection.begin():
        return _with_transaction(operation, options, connection, direct=direct, names=names)


def _in_autocommit(
    engine: Engine,
    operation: Operation[T],
    options: Mapping[str, Any],
    *,
    direct: bool = True,
    names: TableNames = DEFAULT_NAMES,
) -> T:
    """`operation`, one statement, on a connection in autocommit: the statement is its own transaction (on
    asyncpg and psycopg no `BEGIN` or `COMMIT` is sent; the pool restores the isolation level at check-in)."""
    with engine.connect() as connection:
        connection.execution_options(isolation_level='AUTOCOMMIT')
        return _with_transaction(operation, options, connection, direct=direct, names=names)


def _first_row_in_autocommit(
    engine: Engine, statement: Prepared, parameters: Mapping[str, Any], *, names: TableNames = DEFAULT_NAMES
) -> Any:
    """The first row of `statement`, run in autocommit straight on a pooled DBAPI connection of the store's own
    engine (no `Connection`, no execution options, no `BEGIN` or `COMMIT`; the connection's autocommit is
    restored before it goes back to the pool); through Core, as `_in_autocommit` runs it, if the statement
    does not qualify for the driver."""
    translated = names.translate(statement)
    pooled = engine.raw_connection()
    driver: Any = pooled.dbapi_connection
    driver.autocommit = True
    try:
        result = _on_driver(translated, driver, engine.dialect, parameters, pooled)
    except BaseException as error:
        if not isinstance(error, Exception):
            pooled.invalidate(error)  # interrupted in flight (a cancellation), as Core drops such a connection
        raise
    finally:
        driver.autocommit = False
        pooled.close()
    if result is None:
        return _in_autocommit(engine, partial(_first_row, statement, parameters), {}, names=names)
    return result.first()


class AsyncExecutor:
    """Transactions on an `AsyncEngine`, or statements in the transaction of a caller's `AsyncConnection` or
    `AsyncSession`.

    `direct`: the store built the engine itself, so `Prepared` statements may run on its DBAPI
    connections (an application's engine or connection keeps every statement in Core's sight).
    """

    def __init__(self, bind: AsyncBind, *, direct: bool = False) -> None:
        from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession  # loaded: the bind is one of them

        self._bind = bind
        self._direct = direct
        engine = bind if isinstance(bind, AsyncEngine) else None
        single_connection = engine is None or isinstance(engine.pool, StaticPool)
        self._serial = asyncio.Lock() if single_connection else None
        """Held for every operation when there is only one connection (or one session) to share."""
        dialect = bind.sync_session.get_bind().dialect if isinstance(bind, AsyncSession) else bind.dialect
        sqlite = dialect.name == 'sqlite'
        self._writer = asyncio.Lock() if sqlite and not single_connection else None
        """SQLite admits one writer at a time: this process's writers queue here."""
        self._uninterruptible = sqlite
        """A cancellation waits for the operation in flight instead of interrupting its statement."""
        self._statements_on_driver = direct and engine is not None and not single_connection and not sqlite
        """A single statement in autocommit runs straight on a pooled DBAPI connection (the store's own
        PostgreSQL engine)."""

    async def run(
        self,
        operation: Operation[T],
        *,
        write: bool,
        options: Mapping[str, Any],
        names: TableNames = DEFAULT_NAMES,
        one_statement: bool = False,
    ) -> T:
        running = self._run(operation, write=write, options=options, names=names, one_statement=one_statement)
        if self._uninterruptible:
            return await run_to_completion(running)
        return await running

    async def _run(
        self,
        operation: Operation[T],
        *,
        write: bool,
        options: Mapping[str, Any],
        names: TableNames,
        one_statement: bool,
    ) -> T:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession  # loaded: the bind is one of them

        writer = self._writer if write else None
        async with self._serial or contextlib.nullcontext(), writer or contextlib.nullcontext():
            if isinstance(self._bind, AsyncSession):
                # The connection of the session's current transaction (begun now if none is open): after
                # the application commits, the next operation runs in the session's next transaction.
                connection = await self._bind.connection()
                return await connection.run_sync(
                    partial(_with_transaction, operation, options, direct=False, names=names)
                )
            if isinstance(self._bind, AsyncConnection):
                return await self._bind.run_sync(
                    partial(_with_transaction, operation, options, direct=self._direct, names=names)
                )
            # The whole transaction (checkout, BEGIN, the operation, COMMIT, check-in) in one greenlet,
            # as `AsyncConnection.run_sync` runs one function: the same pool and engine events as
            # `async with engine.connect(), connection.begin()`, without a greenlet for each of them.
            engine = self._bind.sync_engine
            run = _in_autocommit if one_statement else _in_transaction
            return await greenlet_spawn(run, engine, operation, options, direct=self._direct, names=names)

    async def run_statement(
        self,
        statement: Prepared,
        parameters: Mapping[str, Any],
        *,
        options: Mapping[str, Any],
        names: TableNames = DEFAULT_NAMES,
        autocommit: bool,
    ) -> Any:
        """On the store's own engine, in autocommit without execution options: checkout, the statement on the
        DBAPI connection and check-in in one greenlet (`_first_row_in_autocommit`); otherwise as `run`."""
        if autocommit and self._statements_on_driver and not options:
            engine = self._bind.sync_engine  # type: ignore[union-attr]  # an engine: `_statements_on_driver`
            return await greenlet_spawn(_first_row_in_autocommit, engine, statement, parameters, names=names)
        return await self.run(
            partial(_first_row, statement, parameters),
            write=True,
            options=options,
            names=names,
            one_statement=autocommit,
        )

    def follow_loop(self) -> None:
        """New locks; on an engine the store built, a new pool: its connections belong to the previous loop
        (asyncpg binds them), so they are let go without being closed there (asyncpg terminates one it finds
        unclosed, if its loop is still open). An application's engine, connection or session is its own."""
        if self._serial is not None:
            self._serial = asyncio.Lock()
        if self._writer is not None:
            self._writer = asyncio.Lock()
        from sqlalchemy.ext.asyncio import AsyncEngine

        if self._direct and isinstance(self._bind, AsyncEngine):
            self._bind.sync_engine.dispose(close=False)

    async def dispose(self) -> None:
        from sqlalchemy.ext.asyncio import AsyncEngine

        if isinstance(self._bind, AsyncEngine):
            await self._bind.dispose()
