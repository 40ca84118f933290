"""What a store error means: the store could not be reached, or the database refused the operation.

An orchestrator can retry later on `'unreachable'`, and treat `'database'` as a problem with the
database itself (a locked or read-only file, a missing table, a refused statement). The command
line turns the two into its exit codes.
"""

from __future__ import annotations

from typing import Literal

__all__ = ['ErrorKind', 'classify_error', 'driver_message']

ErrorKind = Literal['unreachable', 'database', 'other']

_CONNECTION_SQLSTATES = ('08', '28', '3D000', '57P03', '53300')
"""PostgreSQL SQLSTATEs of a server that cannot be connected to: connection exceptions (class 08),
rejected credentials (28), no such database, starting up or shutting down, too many connections."""

_SQLITE_CANNOT_OPEN = 'unable to open database file'

_DATABASE_ERRORS = {
    ('sqlalchemy.exc', 'DBAPIError'),
    ('sqlite3', 'Error'),
    ('pymongo.errors', 'PyMongoError'),
    ('asyncpg.exceptions._base', 'PostgresError'),
    ('asyncpg.exceptions._base', 'InterfaceError'),
    ('psycopg', 'Error'),
}
"""Driver errors (matched by module and name: drivers are optional) that a database raised."""


def classify_error(error: BaseException) -> ErrorKind:
    """Whether `error` means the store could not be reached or opened, or the database refused an operation.

    Unreachable: an OS-level connection failure (refused, timed out, no route, a file store
    directory that cannot be used), a connection SQLAlchemy invalidated, a PostgreSQL connection
    or authentication failure (psycopg's failures to connect carry no SQLSTATE), a MongoDB
    connection failure or server selection timeout, or SQLite's "unable to open database file".
    Any other driver error (a locked database, a missing table, a refused statement) is a database
    error.
    """
    chain = _causes(error)
    for cause in chain:
        if isinstance(cause, OSError | TimeoutError):
            return 'unreachable'
        if getattr(cause, 'connection_invalidated', False) is True:
            return 'unreachable'
        sqlstate = getattr(cause, 'sqlstate', None)
        if isinstance(sqlstate, str) and sqlstate.startswith(_CONNECTION_SQLSTATES):
            return 'unreachable'
        if _is_a(cause, 'pymongo.errors', 'ConnectionFailure'):
            return 'unreachable'
        if _is_a(cause, 'pymongo.errors', 'OperationFailure') and getattr(cause, 'code', None) == 18:
            return 'unreachable'  # AuthenticationFailed
        if _is_a(cause, 'sqlite3', 'OperationalError') and _SQLITE_CANNOT_OPEN in str(cause):
            return 'unreachable'
        if _is_a(cause, 'psycopg', 'OperationalError') and sqlstate is None:
            return 'unreachable'  # psycopg's failure to connect carries no SQLSTATE and no OSError
    if any(_is_a(cause, module, name) for cause in chain for module, name in _DATABASE_ERRORS):
        return 'database'
    return 'other'


def _is_a(error: BaseException, module: str, name: str) -> bool:
    return any(cls.__module__ == module and cls.__name__ == name for cls in type(error).__mro__)


def driver_message(error: BaseException) -> str:
    """The database driver's own message in `error`'s chain, with its type (SQLAlchemy's wrapper adds a
    link to its docs); `error`'s own message if no driver error is in the chain."""
    for cause in _causes(error):
        if _is_a(cause, 'sqlalchemy.exc', 'DBAPIError'):
            orig = getattr(cause, 'orig', None)
            if isinstance(orig, BaseException):
                return f'{type(orig).__name__}: {orig}'
    return f'{type(error).__name__}: {error}'


def _causes(error: BaseException) -> list[BaseException]:
    """`error`, what it was raised from or while handling, and a SQLAlchemy wrapper's driver error."""
    chain: list[BaseException] = []
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop(0)
        if current in chain:
            continue
        chain.append(current)
        orig = getattr(current, 'orig', None)
        if isinstance(orig, BaseException):
            pending.append(orig)
        if current.__cause__ is not None:
            pending.append(current.__cause__)
        elif current.__context__ is not None and not current.__suppress_context__:
            pending.append(current.__context__)
    return chain
