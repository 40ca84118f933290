"""The indexes the Mongo stores need, created once per store on its first write (dropping obsolete ones)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.errors import DuplicateKeyError, OperationFailure

from step_persistence.stores.mongo._client import Database

__all__ = [
    'CONTINUED_ORIGIN_INDEX',
    'CONVERSATION_INDEXES',
    'IDEMPOTENCY_INDEX',
    'LINE_INDEXES',
    'LINE_NUMBER_INDEX',
    'OBSOLETE_STEP_INDEXES',
    'RUN_ID_INDEX',
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

LINE_NUMBER_INDEX: Final = 'line_no'
"""The unique index on `(line, no)` of messages: inserting a message document claims its number on its line."""

CONTINUED_ORIGIN_INDEX: Final = 'continued_origin'
"""The unique partial index on `(origin.run_id, origin.seq)` of runs whose origin kind is `continued`."""

RUN_ID_INDEX: Final = '_id_'
"""The unique index on `_id` every collection has (on `runs`: the run id)."""

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


_RUN_ORDER: Final = ('started_at', 'started_at_us', 'registration')


STEP_INDEXES: Final[Mapping[str, Sequence[IndexModel]]] = {
    'runs': [
        IndexModel(_on(*_RUN_ORDER), name='started_at'),
        IndexModel(_on('conversation_id', *_RUN_ORDER), name='conversation_started'),
        IndexModel(_on('parent_run_id', *_RUN_ORDER), name='parent_started'),
        IndexModel(_on('agent_name', *_RUN_ORDER), name='agent_started'),
        IndexModel(_on('origin.run_id', *_RUN_ORDER), name='origin_started'),
        IndexModel(
            _on('origin.run_id', 'origin.seq'),
            name=CONTINUED_ORIGIN_INDEX,
            unique=True,
            partialFilterExpression={'origin.kind': 'continued'},
        ),
    ],
    'events': [IndexModel(_on('run_id', 'seq'), name='run_seq', unique=True), _idempotency()],
    'snapshots': [
        IndexModel(_on('run_id', 'seq'), name='run_seq', unique=True),
        IndexModel(_on('run_id', 'state', 'seq'), name='run_state_seq'),
        _idempotency(),
        IndexModel(_on('line', 'through_message'), name='line_through'),
        IndexModel(_on('history_digest', 'run_id', 'seq'), name='history_digest'),
    ],
    'tool_effects': [
        IndexModel(_on('run_id', 'tool_call_id'), name=TOOL_CALL_INDEX, unique=True),
        IndexModel(_on('run_id', 'status'), name='run_status'),
    ],
    'messages': [
        IndexModel(
            _on('line', 'no'),
            name=LINE_NUMBER_INDEX,
            unique=True,
            partialFilterExpression={'line': {'$type': 'string'}},
        ),
        IndexModel([('line', ASCENDING), ('position', ASCENDING), ('no', DESCENDING)], name='line_position_no'),
        IndexModel(_on('line', 'no', 'position'), name='line_no_position'),
    ],
}
"""Per collection of `MongoStepStore`, the indexes it creates on its first write (`counters` needs only `_id`).

Messages written before lines existed (no `line`) stay out of the unique `line_no`; their runs'
reads use `run_position_no`, the index such databases already have."""

LINE_INDEXES: Final[Mapping[str, Sequence[IndexModel]]] = {'lines': [IndexModel(_on('base.line'), name='base_line')]}
"""The index of `lines`, created before a store writes its first branch (most databases never have one)."""

CONVERSATION_INDEXES: Final[Mapping[str, Sequence[IndexModel]]] = {
    'conversations': [IndexModel(_on('last.at', 'last.us', '_id'), name='last_started')]
}
"""The index of `conversations`, created before a store writes its first conversation summary."""

OBSOLETE_STEP_INDEXES: Final[Mapping[str, Sequence[str]]] = {
    'runs': ['conversation_id', 'parent_run_id'],
    'messages': ['run_no'],
}
"""Indexes earlier versions created, dropped before the store's own are created: the runs' single-field
ones are prefixes of the new compound ones, and the unique `(run_id, no)` of messages would refuse a
run's second line (numbered from 1 again)."""


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
    """Creates a store's indexes once, on first use (dropping `obsolete` ones first), and retries after a failure.

    `then` runs once the indexes exist, before the first write goes on (see `_conversations.py`).
    """

    def __init__(
        self,
        database: Database,
        indexes: Mapping[str, Sequence[IndexModel]],
        *,
        obsolete: Mapping[str, Sequence[str]] | None = None,
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._database = database
        self._indexes = indexes
        self._obsolete = obsolete or {}
        self._then = then
        self._done = False
        self._lock = asyncio.Lock()

    async def ensure(self) -> None:
        """Create every index unless this object already did; raise `IndexCreationError` on failure."""
        if self._done:
            return
        async with self._lock:
            if self._done:
                return
            for collection, names in self._obsolete.items():
                await self._drop(collection, names)
            for collection, models in self._indexes.items():
                try:
                    await self._database[collection].create_indexes(list(models))
                except OperationFailure as error:
                    raise IndexCreationError(self._explain(collection, error)) from error
            if self._then is not None:
                await self._then()
            self._done = True

    async def _drop(self, collection: str, names: Sequence[str]) -> None:
        handle = self._database[collection]
        present = await handle.index_information()
        for name in names:
            if name not in present:
                continue
            try:
                await handle.drop_index(name)
            except OperationFailure as error:
                if error.code != 27:  # IndexNotFound: another store dropped it first
                    raise IndexCreationError(self._explain(collection, error)) from error

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
