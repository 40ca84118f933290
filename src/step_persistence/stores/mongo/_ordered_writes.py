"""An ordered list of writes across collections, sent in as few round trips as the server allows.

A batch of `_writes.py` is a list of `Insert` and `Update` operations on several collections, in
the order their effects must take. On a server that has MongoDB 8.0's client-level `bulkWrite`
command (it reports `maxWireVersion` 25 or more) the whole list is one command, split by the
driver only where it exceeds the server's message size; on older servers it is one ordered
`bulk_write` per run of consecutive operations on the same collection. Either way the writes are
ordered: they are applied in turn and the first one that fails stops the rest, so a caller told
which operation failed (`Stopped`) knows exactly what landed (everything before it) and can go
on from there. A write concern error, or a failure that is not one operation's, is raised.

`OrderedWrites.for_database` asks the server its wire version once (a `hello`) and picks the way.
A server of 8.0 or later that refuses the command itself (`CommandNotFound`, or
`CommandNotSupported`, as MongoDB 8.0 answers while its feature compatibility version is still
7.0) with nothing applied gets the list per collection instead, from then on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Final, cast

from pymongo import InsertOne, UpdateOne
from pymongo.errors import BulkWriteError, ClientBulkWriteException, OperationFailure

from step_persistence._reading import logger
from step_persistence.stores.mongo._client import Database

__all__ = ['CLIENT_BULK_WRITE_WIRE_VERSION', 'Insert', 'Operation', 'OrderedWrites', 'Stopped', 'Update']

CLIENT_BULK_WRITE_WIRE_VERSION: Final = 25
"""The wire version of MongoDB 8.0, the first server with the client-level `bulkWrite` command."""

_REFUSED: Final = frozenset({59, 115})
"""`CommandNotFound`, `CommandNotSupported`: the server does not take a client-level `bulkWrite` after all."""


@dataclass(frozen=True, slots=True)
class Insert:
    """Insert `document` into `collection`."""

    collection: str
    document: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Update:
    """Update the one document of `collection` matching `filter` (inserting one if `upsert` and none does)."""

    collection: str
    filter: dict[str, Any]
    update: dict[str, Any]
    upsert: bool = False


Operation = Insert | Update


@dataclass(frozen=True, slots=True)
class Stopped:
    """Operation `index` of the list failed with `error` (a server write error: `code`, `errmsg`, maybe
    `keyPattern`); the operations before it were applied, it and those after it were not."""

    index: int
    error: Mapping[str, Any]
    exception: Exception
    """What the driver raised (for a caller that does not go on past this failure to raise)."""


def _collection_model(operation: Operation) -> InsertOne[dict[str, Any]] | UpdateOne:
    if isinstance(operation, Insert):
        return InsertOne(operation.document)
    return UpdateOne(operation.filter, operation.update, upsert=operation.upsert)


def _client_model(namespace: str, operation: Operation) -> InsertOne[dict[str, Any]] | UpdateOne:
    if isinstance(operation, Insert):
        return InsertOne(operation.document, namespace=namespace)
    return UpdateOne(operation.filter, operation.update, upsert=operation.upsert, namespace=namespace)


class OrderedWrites:
    """Sends ordered operation lists to one database, by client `bulkWrite` or per collection (see the module)."""

    def __init__(self, database: Database, *, client_bulk_write: bool) -> None:
        self._database = database
        self.client_bulk_write = client_bulk_write
        """Whether lists go as one client-level `bulkWrite` (MongoDB 8.0+) rather than per collection."""

    @classmethod
    async def for_database(cls, database: Database) -> OrderedWrites:
        """The way the database's server takes: its `maxWireVersion` (one `hello`) decides."""
        hello = await database.command('hello')
        wire_version = hello.get('maxWireVersion')
        supported = isinstance(wire_version, int) and wire_version >= CLIENT_BULK_WRITE_WIRE_VERSION
        return cls(database, client_bulk_write=supported)

    async def send(self, operations: Sequence[Operation]) -> Stopped | None:
        """Apply `operations` in order; `None` if all were, else where the first failure stopped them."""
        if not operations:
            return None
        if self.client_bulk_write:
            return await self._send_at_once(operations)
        return await self._send_per_collection(operations)

    async def _send_per_collection(self, operations: Sequence[Operation]) -> Stopped | None:
        start = 0
        for name, run in groupby(operations, key=lambda operation: operation.collection):
            group = list(run)
            try:
                await self._database[name].bulk_write([_collection_model(op) for op in group], ordered=True)
            except BulkWriteError as error:
                failures = error.details.get('writeErrors', [])
                if error.details.get('writeConcernErrors') or not failures:
                    raise
                return Stopped(index=start + int(failures[0]['index']), error=failures[0], exception=error)
            start += len(group)
        return None

    async def _send_at_once(self, operations: Sequence[Operation]) -> Stopped | None:
        database = self._database
        models = [_client_model(f'{database.name}.{op.collection}', op) for op in operations]
        try:
            await database.client.bulk_write(models, ordered=True, write_concern=database.write_concern)
        except ClientBulkWriteException as error:
            refused = error.error
            if isinstance(refused, OperationFailure) and refused.code in _REFUSED and not error.partial_result:
                logger.info('the server refused a client-level bulkWrite (%s); writing per collection', refused)
                self.client_bulk_write = False
                return await self._send_per_collection(operations)
            if error.write_concern_errors or error.error is not None or not error.write_errors:
                raise
            failures = cast(list[Mapping[str, Any]], error.write_errors)  # documents, whatever the annotation says
            failure = min(failures, key=lambda failure: int(failure['idx']))
            return Stopped(index=int(failure['idx']), error=failure, exception=error)
        return None
