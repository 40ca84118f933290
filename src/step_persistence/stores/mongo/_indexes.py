"""The indexes the Mongo stores need, created once per store on its first write."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.errors import DuplicateKeyError, OperationFailure

from step_persistence.stores.mongo._client import Database

__all__ = [
    'IDEMPOTENCY_INDEX',
    'MESSAGE_NUMBER_INDEX',
    'STEP_INDEXES',
    'TOOL_CALL_INDEX',
    'IndexCreationError',
    'IndexSetup',
    'chunk_indexes',
    'is_duplicate_on',
    'is_idempotency_conflict',
]

IDEMPOTENCY_INDEX: Final = 'run_idempotency_key'
"""The unique partial index on `(run_id, idempotency_key)` of events and snapshots."""

MESSAGE_NUMBER_INDEX: Final = 'run_no'
"""The unique index on `(run_id, no)` of messages: inserting a message document claims its number."""

TOOL_CALL_INDEX: Final = 'run_tool_call'
"""The unique index on `(run_id, tool_call_id)` of tool effects."""


def _on(*fields: str) -> list[tuple[str, int]]:
    return [(field, ASCENDING) for field in fields]


def _idempotency() -> IndexModel:
    return IndexModel(
        _on('run_id', 'idempotency_key'),
        name=IDEMPOTENCY_INDEX,
        unique=True,
        partialFilterExpression={'idempotency_key': {'$type': 'string'}},
    )


STEP_INDEXES: Final[Mapping[str, Sequence[IndexModel]]] = {
    'runs': [
        IndexModel(_on('conversation_id'), name='conversation_id', sparse=True),
        IndexModel(_on('parent_run_id'), name='parent_run_id', sparse=True),
        IndexModel(_on('started_at', 'started_at_us', 'registration'), name='started_at'),
    ],
    'events': [IndexModel(_on('run_id', 'seq'), name='run_seq', unique=True), _idempotency()],
    'snapshots': [
        IndexModel(_on('run_id', 'seq'), name='run_seq', unique=True),
        IndexModel(_on('run_id', 'state', 'seq'), name='run_state_seq'),
        _idempotency(),
    ],
    'tool_effects': [
        IndexModel(_on('run_id', 'tool_call_id'), name=TOOL_CALL_INDEX, unique=True),
        IndexModel(_on('run_id', 'status'), name='run_status'),
    ],
    'messages': [
        IndexModel(_on('run_id', 'no'), name=MESSAGE_NUMBER_INDEX, unique=True),
        IndexModel([('run_id', ASCENDING), ('position', ASCENDING), ('no', DESCENDING)], name='run_position_no'),
    ],
}
"""Per collection of `MongoStepStore`, the indexes it creates (`counters` needs only `_id`)."""


def chunk_indexes(collection: str) -> Mapping[str, Sequence[IndexModel]]:
    """The index of a `MongoMediaStore` chunks collection: unique `(files_id, n)`."""
    return {collection: [IndexModel(_on('files_id', 'n'), name='files_id_n', unique=True)]}


class IndexCreationError(RuntimeError):
    """An index could not be created: existing documents violate it, or it clashes with another index."""


def is_duplicate_on(failure: Mapping[str, Any], index: str, fields: Sequence[str]) -> bool:
    """Whether a write error (`DuplicateKeyError.details` or one of a bulk write's `writeErrors`)
    is a duplicate key on the unique index `index` over `fields` (and not on another index)."""
    if failure.get('code') != 11000:
        return False
    pattern = failure.get('keyPattern')
    if isinstance(pattern, Mapping):
        return list(pattern) == list(fields)
    return f'index: {index} ' in str(failure.get('errmsg', ''))


def is_idempotency_conflict(failure: Mapping[str, Any]) -> bool:
    """Whether a write error is a duplicate on the idempotency-key index of events or snapshots."""
    return is_duplicate_on(failure, IDEMPOTENCY_INDEX, ('run_id', 'idempotency_key'))


class IndexSetup:
    """Creates a store's indexes once, on first use, and retries after a failure."""

    def __init__(self, database: Database, indexes: Mapping[str, Sequence[IndexModel]]) -> None:
        self._database = database
        self._indexes = indexes
        self._done = False
        self._lock = asyncio.Lock()

    async def ensure(self) -> None:
        """Create every index unless this object already did; raise `IndexCreationError` on failure."""
        if self._done:
            return
        async with self._lock:
            if self._done:
                return
            for collection, models in self._indexes.items():
                try:
                    await self._database[collection].create_indexes(list(models))
                except OperationFailure as error:
                    raise IndexCreationError(self._explain(collection, error)) from error
            self._done = True

    def _explain(self, collection: str, error: OperationFailure) -> str:
        where = f'{self._database.name}.{collection}'
        if isinstance(error, DuplicateKeyError) or error.code == 11000:
            return (
                f'cannot create a unique index on {where}: the collection already holds documents that '
                f'violate it ({error}); remove the duplicates, then write again (creation is retried)'
            )
        if error.code in (85, 86):
            return (
                f'an index on {where} already exists with the same name or keys but other options '
                f'({error}); drop it so that the store can create its own'
            )
        if error.code == 13:
            return f'not allowed to create indexes on {where} ({error}); the store needs the readWrite role'
        return f'creating the indexes of {where} failed: {error}'
