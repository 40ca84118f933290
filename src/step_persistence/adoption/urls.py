"""`harness+...://` URLs: the stores pydantic-ai-harness wrote, opened read-only.

- `harness+file:///path/to/dir` (or `harness+file://relative/dir`): its `FileStepStore` directory;
- `harness+sqlite:///relative.db` (`harness+sqlite:////absolute.db`): its `SqliteStepStore` file;
  `?media_table=` names its media store's table when it had one of its own (`media` by default);
- `harness+postgresql://user@host/db` (or `harness+postgres://`): its `PostgresStepStore` tables;
  `?table=` is the store's `table=` (`step_persistence` by default), `?media_table=` its media
  store's table (`<table>_media` by default);
- `harness+mongodb://host/db` (or `harness+mongodb+srv://`): its `MongoStepStore` collections,
  the database named by the path (or `database=`).

Keyword options go to the store (`media_store=`: where its blobs are, when elsewhere).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy.engine import URL, make_url

from step_persistence._urls import redact_url, url_scheme
from step_persistence.stores.harness import HarnessStore

__all__ = ['HARNESS_PREFIX', 'harness_local_path', 'inner_url', 'open_harness_store']

HARNESS_PREFIX = 'harness+'

_SCHEMES = ('file', 'sqlite', 'postgresql', 'postgres', 'mongodb')


def inner_url(url: str) -> str:
    """The URL of the harness's store itself (`sqlite:///old.db` for `harness+sqlite:///old.db`).

    Raises `ValueError` for a URL that is not `harness+<file|sqlite|postgresql|mongodb>://...`.
    """
    if not url[: len(HARNESS_PREFIX)].lower() == HARNESS_PREFIX:
        raise ValueError(f'not a harness store URL (harness+sqlite:///old.db, ...): {redact_url(url)}')
    inner = url[len(HARNESS_PREFIX) :]
    if url_scheme(inner) not in _SCHEMES:
        raise ValueError(
            f'unsupported harness store URL {redact_url(url)}: use harness+file://, harness+sqlite://, '
            'harness+postgresql:// or harness+mongodb://'
        )
    return inner


def _directory(inner: str) -> str:
    directory = unquote(inner.split('://', 1)[1].split('?', 1)[0])
    if not directory:
        raise ValueError(f'the harness file store URL names no directory: {redact_url(inner)}')
    return directory


def _sql_options(inner: str, allowed: tuple[str, ...]) -> tuple[URL, dict[str, str]]:
    """The SQL URL without our query options, and those options (each given once, not empty)."""
    try:
        parsed = make_url(inner)
    except Exception as error:
        raise ValueError(f'not a SQL URL: {redact_url(inner)}') from error
    named: dict[str, str] = {}
    for option in ('table', 'media_table'):
        value = parsed.query.get(option)
        if value is None:
            continue
        if option not in allowed:
            raise ValueError(f'?{option}= applies to harness+postgresql:// stores only')
        if not isinstance(value, str) or not value:
            raise ValueError(f'?{option}= in a store URL names one value, once')
        named[option] = value
    return parsed.difference_update_query(list(named)), named


def _sqlite_file(parsed: URL) -> Path:
    if parsed.get_backend_name() != 'sqlite' or not parsed.database or parsed.database == ':memory:':
        raise ValueError(f'a harness SQLite URL names its file: harness+sqlite:///old.db, not {parsed}')
    return Path(parsed.database)


def harness_local_path(url: str) -> Path | None:
    """The directory or SQLite file a harness URL names (`None` for a server), whether or not it exists."""
    inner = inner_url(url)
    scheme = url_scheme(inner)
    if scheme == 'file':
        return Path(_directory(inner))
    if scheme == 'sqlite':
        return _sqlite_file(_sql_options(inner, ('media_table',))[0])
    return None


def open_harness_store(url: str, **options: Any) -> HarnessStore:
    """The read-only store over what pydantic-ai-harness wrote at `url` (see the module's docstring).

    Raises `ValueError` for a URL that names none; opens no connection (the first read does).
    """
    from step_persistence.stores.harness import HarnessFileStore
    from step_persistence.stores.harness.sql import DEFAULT_POSTGRES_TABLE, HarnessSqlStore, HarnessTables

    inner = inner_url(url)
    scheme = url_scheme(inner)
    if scheme == 'file':
        return HarnessFileStore(_directory(inner), **options)
    if scheme == 'sqlite':
        parsed, named = _sql_options(inner, ('media_table',))
        tables = HarnessTables.sqlite(media=named.get('media_table', 'media'))
        return HarnessSqlStore.sqlite(_sqlite_file(parsed), tables=tables, **options)
    if scheme in ('postgresql', 'postgres'):
        parsed, named = _sql_options(inner, ('table', 'media_table'))
        if parsed.get_backend_name() == 'postgres':
            parsed = parsed.set(drivername='postgresql')
        tables = HarnessTables.postgres(
            table=named.get('table', DEFAULT_POSTGRES_TABLE), media=named.get('media_table')
        )
        return HarnessSqlStore.postgres(parsed, tables=tables, **options)
    from step_persistence.stores.harness.mongo import HarnessMongoStore

    options = dict(options)
    if 'database' not in options:
        location = inner.split('://', 1)[1].split('?', 1)[0]
        options['database'] = unquote(location.rpartition('@')[2].partition('/')[2])
    if not options['database']:
        raise ValueError('name the harness MongoDB database in the URL (harness+mongodb://host/<database>)')
    return HarnessMongoStore(db_url=inner, **options)
