"""The MongoDB client a store talks through: accepted client types, ownership and database handles.

Both stores of this package (`MongoStepStore`, `MongoMediaStore`) take either a client the
caller owns or a URL from which they build (and later close) their own, one for each event loop
they are used from (`MongoConnection`, `_loops.py`). Only asynchronous
clients are accepted, so no call blocks the event loop: pymongo's `AsyncMongoClient` (the
maintained driver) and motor's `AsyncIOMotorClient` (deprecated upstream, still common). Both
expose the same awaitable collection API (except `aggregate`: use `aggregate_all`); this module
hands out handles typed as pymongo's.

A URL's password never leaves this module: a refused URL is shown only through `redact_url` (a
string without a scheme, which the redactor would not recognise as a URL, is not shown at all),
and what pymongo refuses while parsing one becomes a `ValueError` naming the redacted URL.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar, cast

from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient, MongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, ConfigurationError, DuplicateKeyError, InvalidName, InvalidOperation
from pymongo.write_concern import WriteConcern

from step_persistence._urls import redact_text, redact_url, url_scheme
from step_persistence.stores.mongo._loops import BoundClient, close_client

if TYPE_CHECKING:
    from motor.motor_asyncio import AsyncIOMotorClient

__all__ = [
    'CODEC_OPTIONS',
    'JOURNAL_UNITS',
    'JOURNAL_WORKFLOWS',
    'Database',
    'MongoClientLike',
    'MongoConnection',
    'aggregate_all',
    'insert_new',
    'upsert',
]

T = TypeVar('T')

JOURNAL_WORKFLOWS = 'durable_workflows'
JOURNAL_UNITS = 'durable_units'
"""The durable journal's collections (`journal.py`), beside the step store's in its database."""

MongoClientLike: TypeAlias = 'AsyncMongoClient[Any] | AsyncIOMotorClient[Any]'
"""A client a caller may pass: pymongo's `AsyncMongoClient` or motor's `AsyncIOMotorClient`."""

Database: TypeAlias = AsyncDatabase[dict[str, Any]]
"""A database handle (a motor database is used through the same, identical, awaitable API)."""

_SCHEMES: Final = ('mongodb', 'mongodb+srv')
"""The URL schemes the driver reads (lower-case only: `_mongodb_url` lower-cases a caller's)."""

CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(document_class=dict, tz_aware=True, tzinfo=UTC)
"""How the stores read BSON, whatever the caller's client is configured with: dates as aware UTC."""


def _mongodb_url(db_url: object) -> str:
    """`db_url` with its scheme lower-cased (the driver reads only `mongodb://` and `mongodb+srv://`).

    `ValueError` for anything else; the message shows the URL only redacted.
    """
    if isinstance(db_url, str) and url_scheme(db_url) == 'mongodb':
        scheme, _, rest = db_url.partition('://')
        if scheme.lower() in _SCHEMES:
            return f'{scheme.lower()}://{rest}'
    if not isinstance(db_url, str):
        shown = f'a {type(db_url).__name__}'
    elif url_scheme(db_url) is None:
        shown = 'a string without a scheme://'  # not a URL to the redactor: its password would show
    else:
        shown = repr(redact_url(db_url))
    raise ValueError(f'db_url must be a mongodb:// or mongodb+srv:// URL, got {shown}')


def _client_for(db_url: str) -> AsyncMongoClient[dict[str, Any]]:
    """A pymongo client for `db_url`; what pymongo refuses in the URL is a `ValueError` naming it redacted.

    pymongo's own message is kept (redacted too), but not the exception itself, so nothing of the
    raw URL can travel on in its arguments.
    """
    try:
        return AsyncMongoClient(db_url)
    except (ConfigurationError, ValueError) as error:
        message = redact_text(str(error))
    raise ValueError(f'cannot use MongoDB URL {redact_url(db_url)!r}: {message}')


def _is_motor_client(client: object) -> bool:
    try:
        from motor.motor_asyncio import AsyncIOMotorClient
    except ImportError:
        return False
    return isinstance(client, AsyncIOMotorClient)


class MongoConnection:
    """The client a store talks through, and whether the store owns it (built it from a URL).

    pymongo binds a client to the event loop of its first operation, and an application may use a
    store from one loop, then another (`run_sync` and `asyncio.run` in turn; never two at once).
    So the store's own client is replaced at the first operation on a new loop, the old one closed
    on its own loop without waiting for it (`_loops.BoundClient`). A caller's client is the
    caller's: the store uses it as it is, on whatever loop, so it must be used from one loop.
    """

    def __init__(self, client: MongoClientLike, *, url: str | None) -> None:
        self.client: MongoClientLike = client
        """The newest client: the caller's, or the store's own for the latest loop it served."""
        self._url = url
        self._bound: BoundClient | None = None
        self._closed = False

    @classmethod
    def open(cls, *, client: object, db_url: object) -> MongoConnection:
        """Take exactly one of a caller's async client or a `mongodb://` / `mongodb+srv://` URL (scheme in any case).

        Raises `ValueError` when both or neither are given or the URL has another scheme, and
        `TypeError` for anything but an async client (a synchronous `MongoClient` would block
        the event loop).
        """
        if (client is None) == (db_url is None):
            raise ValueError('give exactly one of client= (an async MongoDB client) or db_url= (a mongodb:// URL)')
        if client is not None:
            if isinstance(client, AsyncMongoClient) or _is_motor_client(client):
                return cls(cast('MongoClientLike', client), url=None)
            if isinstance(client, MongoClient):
                raise TypeError(
                    'a synchronous pymongo MongoClient would block the event loop; '
                    'pass a pymongo AsyncMongoClient or a motor AsyncIOMotorClient'
                )
            raise TypeError(
                f'client must be a pymongo AsyncMongoClient or a motor AsyncIOMotorClient, got {type(client).__name__}'
            )
        url = _mongodb_url(db_url)
        return cls(_client_for(url), url=url)

    def database(self, name: object, client: MongoClientLike | None = None) -> Database:
        """The database `name` through `client` (default: the newest), read with `CODEC_OPTIONS`;
        `ValueError` for an invalid name.

        Writes are acknowledged even if the caller's client is configured with `w=0`: the
        stores rely on the server reporting duplicate keys.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f'database must be a non-empty str, got {name!r}')
        client = self.client if client is None else client
        write_concern = None if client.write_concern.acknowledged else WriteConcern()
        try:
            database = client.get_database(name, codec_options=CODEC_OPTIONS, write_concern=write_concern)
        except InvalidName as error:
            raise ValueError(f'invalid MongoDB database name {name!r}: {error}') from None
        return cast(Database, database)

    def client_on_running_loop(self) -> MongoClientLike:
        """The client for operations on the running loop.

        The store's own client, if another loop used it, is let go there and a new one built for
        the URL; once the store is closed, a new loop gets `InvalidOperation` (as pymongo answers on
        the loop it closed on). A caller's client is returned as it is.
        """
        bound = self._bound
        if self._url is None or (bound is not None and bound.loop is asyncio.get_running_loop()):
            return self.client
        if self._closed:
            raise InvalidOperation('cannot use a MongoDB store after aclose()')
        if bound is not None:
            bound.let_go()
            self.client = _client_for(self._url)
        self._bound = BoundClient(self.client)
        return self.client

    async def aclose(self) -> None:
        """Close the store's own client (once; one bound to another loop is let go there); a caller's stays open."""
        if self._url is None or self._closed:
            return
        self._closed = True
        bound = self._bound
        if bound is None:
            await close_client(self.client)
        elif bound.loop is asyncio.get_running_loop():
            await bound.aclose()
        else:
            bound.let_go()


async def upsert(operation: Callable[[], Awaitable[T]]) -> T:
    """Run an upserting write, once more if it lost an insert race to a concurrent upsert of the same key.

    Two upserts that both find nothing both insert; one fails with a duplicate key. Servers
    before MongoDB 4.2 (and some compatible servers) do not retry that themselves; the second
    attempt finds the document and updates it.
    """
    try:
        return await operation()
    except DuplicateKeyError:
        return await operation()


async def insert_new(collection: AsyncCollection[dict[str, Any]], documents: list[dict[str, Any]]) -> None:
    """Insert `documents`, skipping those whose unique key is already stored (insert-or-ignore)."""
    if not documents:
        return
    try:
        await collection.insert_many(documents, ordered=False)
    except BulkWriteError as error:
        failures = error.details.get('writeErrors', [])
        if error.details.get('writeConcernErrors') or any(failure.get('code') != 11000 for failure in failures):
            raise


async def aggregate_all(
    collection: AsyncCollection[dict[str, Any]], pipeline: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every result of an aggregation, through either driver (pymongo awaits `aggregate`, motor does not).

    Stages may spill to disk (`allowDiskUse`; servers that do not allow it ignore the option).
    """
    cursor: Any = collection.aggregate(pipeline, allowDiskUse=True)
    if inspect.isawaitable(cursor):
        cursor = await cursor
    return cast(list[dict[str, Any]], await cursor.to_list(None))
