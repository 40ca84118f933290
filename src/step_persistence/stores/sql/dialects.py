"""The dialects and async drivers the SQL store supports, and what differs between them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.sql.expression import TableClause

from step_persistence._urls import redact_url

if TYPE_CHECKING:
    from sqlalchemy.dialects import postgresql

DialectInsert: TypeAlias = 'sqlite.Insert | postgresql.Insert'

__all__ = [
    'SHARED_DRIVERS',
    'SUPPORTED_DRIVERS',
    'DialectInsert',
    'check_dialect',
    'dialect_insert',
    'redact',
    'require_asyncpg',
    'resolve_url',
]

SUPPORTED_DRIVERS: dict[str, str] = {'postgresql': 'asyncpg', 'sqlite': 'aiosqlite'}
"""Dialect name -> the async driver of the engines the store builds from a URL (event-loop friendly)."""

SHARED_DRIVERS: dict[str, tuple[str, ...]] = {'postgresql': ('asyncpg', 'psycopg'), 'sqlite': ('aiosqlite',)}
"""Dialect name -> the async drivers of an application's engine, connection or session the store accepts.

psycopg 3 (`postgresql+psycopg://`, SQLAlchemy's async psycopg dialect) only on an application's engine:
every statement then runs through Core (`prepared.py` runs on the DBAPI connections of the store's own
engines only), and the store's own engines stay on asyncpg, whose pool checks (`engines.py`) and URL
parameters are asyncpg's."""


def _supported() -> str:
    return ', '.join(f'{name} ({name}+{driver}://)' for name, driver in sorted(SUPPORTED_DRIVERS.items()))


def _shared() -> str:
    return ', '.join(
        f'{name} ({", ".join(f"{name}+{driver}://" for driver in drivers)})'
        for name, drivers in sorted(SHARED_DRIVERS.items())
    )


def redact(url: str | URL) -> str:
    """The URL as text with every password masked (`step_persistence._urls.redact_url`), for errors and logs."""
    return redact_url(url if isinstance(url, str) else url.render_as_string(hide_password=False))


def check_dialect(dialect_name: str, driver: str, *, where: str, shared: bool = False) -> None:
    """Raise `ValueError` unless `dialect_name`/`driver` is a supported pair; `where` names the source.

    `shared`: the driver of an application's engine, connection or session (`SHARED_DRIVERS`), rather
    than of a URL the store builds its own engine from (`SUPPORTED_DRIVERS`).
    """
    supported = _shared() if shared else _supported()
    if dialect_name not in SUPPORTED_DRIVERS:
        raise ValueError(f'unsupported database dialect {dialect_name!r} in {where}; supported: {supported}')
    if shared:
        if driver not in SHARED_DRIVERS[dialect_name]:
            drivers = ' or '.join(map(repr, SHARED_DRIVERS[dialect_name]))
            raise ValueError(
                f'unsupported driver {driver!r} for {dialect_name} in {where}: the store needs an async driver, '
                f'{drivers}; supported: {supported}'
            )
        return
    expected = SUPPORTED_DRIVERS[dialect_name]
    if driver != expected:
        hint = ''
        if driver in SHARED_DRIVERS[dialect_name]:
            hint = (
                f' (an engine the store builds from a URL uses {expected}; to use {driver}, pass your own '
                f'AsyncEngine, AsyncConnection or AsyncSession)'
            )
        raise ValueError(
            f'unsupported driver {driver!r} for {dialect_name} in {where}: the store needs the async driver '
            f'{expected!r}{hint}; supported: {supported}'
        )


def require_asyncpg() -> None:
    """Raise `ImportError` naming the extra to install when asyncpg cannot be imported."""
    try:
        importlib.import_module('asyncpg')
    except ImportError as error:
        raise ImportError(
            'PostgreSQL support needs asyncpg, which is not installed: '
            'pip install "step-persistence[postgres]" (the step-persistence[postgres] extra)'
        ) from error


def resolve_url(url: str | URL) -> URL:
    """Parse `url`, filling in the async driver (`sqlite://` -> `sqlite+aiosqlite://`, ...).

    Raises `ValueError` (naming the supported dialects) for any other dialect or driver, and
    `ImportError` naming the extra when the PostgreSQL driver is not installed.
    """
    try:
        parsed = make_url(url)
    except Exception as error:
        raise ValueError(f'not a database URL: {redact(url)}') from error
    backend, _, driver = parsed.drivername.lower().partition('+')  # a URL's scheme is case-insensitive
    parsed = parsed.set(drivername=f'{backend}+{driver}' if driver else backend)
    if backend in SUPPORTED_DRIVERS and not driver:
        driver = SUPPORTED_DRIVERS[backend]
        parsed = parsed.set(drivername=f'{backend}+{driver}')
    check_dialect(backend, driver, where=f'URL {redact(parsed)}')
    if backend == 'postgresql':
        require_asyncpg()
    return parsed


def dialect_insert(dialect_name: str) -> Callable[[TableClause], DialectInsert]:
    """The dialect's `insert()` construct, which has `on_conflict_do_nothing/update`.

    SQLAlchemy's PostgreSQL dialect is imported here, on first use (about 20 ms), not by every process
    that opens a SQLite store.
    """
    if dialect_name != 'postgresql':
        return sqlite.insert
    from sqlalchemy.dialects import postgresql

    return postgresql.insert
