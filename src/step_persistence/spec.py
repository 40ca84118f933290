"""`from_spec`: build a store from plain values (agent specs, config files, the command line)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from step_persistence._urls import redact_url, url_scheme

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from step_persistence.protocol import StepStore

__all__ = ['from_spec', 'local_path', 'redact_url', 'sql_location', 'supported_backends']

POSTGRES_SCHEMES = ('postgresql', 'postgres')
"""URL schemes naming PostgreSQL: `postgres://` is what hosted PostgreSQL services put in `DATABASE_URL`."""


def _memory(url: str | None, options: dict[str, Any]) -> StepStore:
    from step_persistence.stores.memory import InMemoryStepStore

    if url not in (None, 'memory://'):
        raise ValueError(f'the memory backend takes no location, got {url!r}')
    return InMemoryStepStore(**options)


def _file_directory(url: str) -> str:
    """The directory a `file://` URL names (`ValueError` if none)."""
    directory = unquote(url.split('://', 1)[1])
    if not directory:
        raise ValueError(f'the file URL {url!r} names no directory')
    return directory


def _file(url: str | None, options: dict[str, Any]) -> StepStore:
    """`file:///absolute/dir` or `file://relative/dir`, or the name `'file'` with `directory=`."""
    from step_persistence.stores.file import FileStepStore

    if url is not None:
        directory = _file_directory(url)
        if 'directory' in options:
            raise ValueError('give the file store its directory in the URL or as directory=, not both')
        options = {**options, 'directory': directory}
    return FileStepStore(**options)


def _sqlite(url: str | None, options: dict[str, Any]) -> StepStore:
    """`sqlite:///relative.db`, `sqlite:////absolute.db`, `sqlite://` (memory), or `'sqlite'` with `database=`;
    `?table_prefix=` in the URL is the `table_prefix` option."""
    from step_persistence.stores.sql import SqliteStepStore
    from step_persistence.stores.sql.sqlite import database_from_url

    if url is not None:
        if 'database' in options:
            raise ValueError('give the SQLite store its database in the URL or as database=, not both')
        location, named = sql_location(url)
        if 'schema' in named:
            raise ValueError('?schema= applies to PostgreSQL stores only')
        options = {**_merged(options, named), 'database': database_from_url(location)}
    return SqliteStepStore(**options)


_URL_OPTIONS = ('schema', 'table_prefix')
"""Store options a SQL store URL may carry as query parameters (the driver would refuse them)."""


def sql_location(url: str | URL) -> tuple[URL, dict[str, str]]:
    """A SQL store URL as SQLAlchemy reads it, and the store options its query parameters name.

    `postgres://` (and `postgres+driver://`) becomes `postgresql://`, the spelling SQLAlchemy
    accepts; `?schema=` (PostgreSQL) and `?table_prefix=` are removed from the URL and returned as
    `schema` and `table_prefix`. Raises `ValueError` for a URL that cannot be parsed or an option
    given twice or empty.
    """
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception as error:
        raise ValueError(f'not a SQL store URL: {redact_url(str(url))}') from error
    backend, plus, driver = parsed.drivername.partition('+')
    if backend == 'postgres':
        parsed = parsed.set(drivername=f'postgresql{plus}{driver}')
    named: dict[str, str] = {}
    for option in _URL_OPTIONS:
        value = parsed.query.get(option)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise ValueError(f'?{option}= in a store URL names one value, once')
        named[option] = value
    return parsed.difference_update_query(list(named)), named


def _merged(options: dict[str, Any], named: dict[str, str]) -> dict[str, Any]:
    """`options` with the options a URL named (`ValueError` when both give one differently)."""
    merged = dict(options)
    for option, value in named.items():
        if merged.get(option) not in (None, value):
            raise ValueError(f'two values of {option}: {value!r} in the URL and {merged[option]!r} as {option}=')
        merged[option] = value
    return merged


def _postgres(url: str | None, options: dict[str, Any]) -> StepStore:
    """`postgresql://...` or `postgres://...` (or `+asyncpg`), or `'postgres'` with `url=`.

    `?schema=` and `?table_prefix=` in the URL are the `schema` and `table_prefix` options (given
    both ways, they must agree).
    """
    from sqlalchemy.engine import URL

    from step_persistence.stores.sql import PostgresStepStore

    options = dict(options)
    given = options.pop('url', None)
    if (url is None) == (given is None):
        raise ValueError('give the PostgreSQL store exactly one URL: as the backend or as url=')
    target = url or given
    if isinstance(target, str | URL):
        target, named = sql_location(target)
        options = _merged(options, named)
    return PostgresStepStore(target, **options)


def _mongo(url: str | None, options: dict[str, Any]) -> StepStore:
    """`mongodb://host/db` or `mongodb+srv://host/db` (or `database=`), or the name `'mongo'` with `db_url=`."""
    from step_persistence.stores.mongo import MongoStepStore

    options = dict(options)
    if url is not None:
        if 'db_url' in options:
            raise ValueError('give the MongoDB store its URL as the backend or as db_url=, not both')
        options['db_url'] = url
        options.setdefault('database', _mongo_database(url))
    if options.get('database') is None:
        raise ValueError('name the MongoDB database in the URL (mongodb://host/<database>) or as database=')
    return MongoStepStore(**options)


def _mongo_database(url: str) -> str | None:
    """The database named by the path of a MongoDB URL (`mongodb://user@h1,h2/<database>?options`)."""
    location = url.split('://', 1)[1].split('?', 1)[0]
    return unquote(location.rpartition('@')[2].partition('/')[2]) or None


def _harness(url: str | None, options: dict[str, Any]) -> StepStore:
    """`harness+file://`, `harness+sqlite://`, `harness+postgresql://`, `harness+mongodb://`: what
    pydantic-ai-harness wrote, read-only (see `step_persistence.adoption.urls`)."""
    from step_persistence.adoption.urls import open_harness_store

    if url is None:
        raise ValueError(
            'the harness backend reads what pydantic-ai-harness wrote: give its URL (harness+sqlite:///...)'
        )
    return open_harness_store(url, **options)


_BACKENDS: dict[str, Callable[[str | None, dict[str, Any]], StepStore]] = {
    'memory': _memory,
    'file': _file,
    'sqlite': _sqlite,
    'postgres': _postgres,
    'mongo': _mongo,
    'harness': _harness,
}
_URL_SCHEMES: dict[str, str] = {
    'memory': 'memory',
    'file': 'file',
    'sqlite': 'sqlite',
    'postgresql': 'postgres',
    'postgres': 'postgres',
    'mongodb': 'mongo',
    'harness': 'harness',
}


def local_path(url: str) -> Path | None:
    """The file or directory on this machine that the store at `url` lives in, whether or not it exists:
    a SQLite database's file, a file store's directory; `None` for any other store (in memory, on a
    server, SQLite's `sqlite://` in memory) and for a backend name without a URL.

    Creates nothing, so that a command can refuse a location that does not exist before opening it.
    Raises `ValueError` for a SQLite or file URL that names no location `from_spec` would accept.
    """
    scheme = url_scheme(url)
    name = _URL_SCHEMES.get(scheme) if scheme is not None else None
    if name == 'harness':
        from step_persistence.adoption.urls import harness_local_path

        return harness_local_path(url)
    if name == 'file':
        return Path(_file_directory(url))
    if name == 'sqlite':
        from step_persistence.stores.sql.sqlite import database_from_url

        database = database_from_url(sql_location(url)[0])
        return None if database == ':memory:' else Path(database)
    return None


def supported_backends() -> list[str]:
    """Backend names `from_spec` accepts."""
    return sorted(_BACKENDS)


def from_spec(backend: str = 'memory', **options: Any) -> StepStore:
    """Build a store from a backend name or a URL plus keyword options.

    `backend` is a name (`'memory'`, ...) or a URL whose scheme picks the backend; it may be given
    by keyword, so `from_spec(**{'backend': 'memory', ...})` works for plain config mappings.
    Remaining options go to the store's constructor (e.g. `max_snapshots_per_run=8`). Raises
    `ValueError` naming the supported backends for anything else.
    """
    url: str | None = None
    name = backend
    scheme = url_scheme(backend)
    if scheme is not None:
        url = backend
        if scheme not in _URL_SCHEMES:
            raise ValueError(
                f'unsupported store URL scheme {scheme!r}; supported schemes: {", ".join(sorted(_URL_SCHEMES))}'
            )
        name = _URL_SCHEMES[scheme]
    factory = _BACKENDS.get(name)
    if factory is None:
        raise ValueError(f'unknown backend {backend!r}; supported backends: {", ".join(supported_backends())}')
    return factory(url, options)
