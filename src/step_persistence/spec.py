"""`from_spec`: build a store from plain values (agent specs, config files, the command line)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from step_persistence._urls import redact_url, url_scheme
from step_persistence.protocol import StepStore

__all__ = ['from_spec', 'redact_url', 'supported_backends']


def _memory(url: str | None, options: dict[str, Any]) -> StepStore:
    from step_persistence.stores.memory import InMemoryStepStore

    if url not in (None, 'memory://'):
        raise ValueError(f'the memory backend takes no location, got {url!r}')
    return InMemoryStepStore(**options)


def _file(url: str | None, options: dict[str, Any]) -> StepStore:
    """`file:///absolute/dir` or `file://relative/dir`, or the name `'file'` with `directory=`."""
    from step_persistence.stores.file import FileStepStore

    if url is not None:
        directory = unquote(url.split('://', 1)[1])
        if not directory:
            raise ValueError(f'the file URL {url!r} names no directory')
        if 'directory' in options:
            raise ValueError('give the file store its directory in the URL or as directory=, not both')
        options = {**options, 'directory': directory}
    return FileStepStore(**options)


def _sqlite(url: str | None, options: dict[str, Any]) -> StepStore:
    """`sqlite:///relative.db`, `sqlite:////absolute.db`, `sqlite://` (memory), or `'sqlite'` with `database=`."""
    from step_persistence.stores.sql import SqliteStepStore
    from step_persistence.stores.sql.sqlite import database_from_url

    if url is not None:
        if 'database' in options:
            raise ValueError('give the SQLite store its database in the URL or as database=, not both')
        options = {**options, 'database': database_from_url(url)}
    return SqliteStepStore(**options)


def _postgres(url: str | None, options: dict[str, Any]) -> StepStore:
    """`postgresql://...` (or `postgresql+asyncpg://...`), or `'postgres'` with `url=`; `schema=` is optional."""
    from step_persistence.stores.sql import PostgresStepStore

    options = dict(options)
    given = options.pop('url', None)
    if (url is None) == (given is None):
        raise ValueError('give the PostgreSQL store exactly one URL: as the backend or as url=')
    return PostgresStepStore(url or given, **options)


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


_BACKENDS: dict[str, Callable[[str | None, dict[str, Any]], StepStore]] = {
    'memory': _memory,
    'file': _file,
    'sqlite': _sqlite,
    'postgres': _postgres,
    'mongo': _mongo,
}
_URL_SCHEMES: dict[str, str] = {
    'memory': 'memory',
    'file': 'file',
    'sqlite': 'sqlite',
    'postgresql': 'postgres',
    'mongodb': 'mongo',
}


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
