"""Sequence numbers from the `counters` collection, allocated with atomic `$inc`.

Each run has its own document (`_id` = run id) holding its last snapshot and event numbers, so
writers of different runs never contend on one document; it also records the run's
`registration`, which tells a run apart from an earlier one registered under the same id. One
store-wide document (`_id` = `{'sequence': 'registrations'}`, which no run id can equal) numbers
registrations, to order runs that started at the same instant.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from step_persistence.stores.mongo._client import Database, upsert

__all__ = ['Allocation', 'Counters']

_REGISTRATIONS: Final = {'sequence': 'registrations'}


@dataclass(frozen=True)
class Allocation:
    """The run's counters right after an increment: `last[name]` is the newest number handed out."""

    registration: int
    last: dict[str, int]


def _stored_number(document: dict[str, Any], name: str, run_id: str) -> int:
    """`document[name]` if it is an integer; a damaged counters document is refused with `ValueError`."""
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f'the counters document of run {run_id!r} is damaged ({name} is {value!r}); nothing of this write '
            'was stored'
        )
    return value


class Counters:
    """Allocates per-run numbers; an allocation for a run that is not registered raises `LookupError`."""

    def __init__(self, database: Database) -> None:
        self._counters = database['counters']
        self._runs = database['runs']

    async def next_registration(self) -> int:
        """A store-wide number, larger than every one handed out before."""
        document = await self._increment(_REGISTRATIONS, {'last': 1})
        if document is None:
            # The first registration in this database creates the counter. Not by an upserting
            # increment: a server may answer one that lost an insert race with no document at all.
            with contextlib.suppress(DuplicateKeyError):
                await self._counters.insert_one({'_id': _REGISTRATIONS, 'last': 0})
            document = await self._increment(_REGISTRATIONS, {'last': 1})
            if document is None:
                raise RuntimeError('the registration counter vanished while being created')
        return int(document['last'])

    async def start_run(self, run_id: str, registration: int) -> None:
        """Create the run's counters (call right after inserting its `runs` document)."""
        await upsert(
            partial(self._counters.update_one, {'_id': run_id}, {'$set': {'registration': registration}}, upsert=True)
        )

    async def allocate(self, run_id: str, **increments: int) -> Allocation:
        """Add `increments` to the run's counters and return them.

        A registered run whose counters are missing (its registration was interrupted between
        the two inserts) gets them now.
        """
        document = await self._increment(run_id, increments)
        if document is None:
            run = await self._runs.find_one({'_id': run_id}, {'registration': 1})
            if run is None:
                raise LookupError(f'run {run_id!r} is not registered')
            repair = {'$setOnInsert': {'registration': run['registration']}}
            await upsert(partial(self._counters.update_one, {'_id': run_id}, repair, upsert=True))
            document = await self._increment(run_id, increments)
            if document is None:
                raise LookupError(f'run {run_id!r} was deleted while being written to')
        return Allocation(
            registration=_stored_number(document, 'registration', run_id),
            last={name: _stored_number(document, name, run_id) for name in increments},
        )

    async def _increment(self, counter_id: Any, increments: dict[str, int]) -> Any:
        return await self._counters.find_one_and_update(
            {'_id': counter_id}, {'$inc': increments}, return_document=ReturnDocument.AFTER
        )

    async def delete_run(self, run_id: str) -> None:
        await self._counters.delete_one({'_id': run_id})
