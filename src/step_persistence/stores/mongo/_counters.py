"""Sequence numbers from the `counters` collection, allocated with atomic `$inc`.

Each run has its own document (`_id` = run id) holding its last snapshot and event numbers, so
writers of different runs never contend on one document; it also records the run's
`registration`, which tells a run apart from an earlier one registered under the same id. One
store-wide document (`_id` = `{'sequence': 'registrations'}`, which no run id can equal) numbers
registrations, to order runs that started at the same instant.

`Counters` remembers the newest counters it saw of recently used runs (`cached`). A writer that
sends its whole batch as one ordered list (`_ordered_writes.py`) takes its numbers from there
without asking: the list starts with `claim`, an update of the counters document that applies
only if they are still exactly the remembered ones, and fails otherwise, which stops the rest of
the list. Numbers are then handed out exactly as by `allocate` (contiguous, never twice), and a
writer whose memory is stale (another store wrote to the run, or deleted it) learns it from that
failure and allocates as usual.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from step_persistence._lru import BoundedLru
from step_persistence.stores.mongo._client import Database, upsert
from step_persistence.stores.mongo._ordered_writes import Update

__all__ = ['NUMBERED', 'Allocation', 'Counters']

NUMBERED: Final = ('event', 'snapshot')
"""The per-run numbers a counters document holds (a missing field: none handed out yet)."""

_REGISTRATIONS: Final = {'sequence': 'registrations'}


@dataclass(frozen=True)
class Allocation:
    """The run's counters right after an increment: `last[name]` is the newest number handed out."""

    registration: int
    last: dict[str, int]

    def after(self, increments: dict[str, int]) -> Allocation:
        """The counters once `increments` are added."""
        return Allocation(
            registration=self.registration,
            last={name: number + increments.get(name, 0) for name, number in self.last.items()},
        )


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

    def __init__(self, database: Database, *, max_runs: int = 256) -> None:
        self._counters = database['counters']
        self._runs = database['runs']
        self._cached: BoundedLru[str, Allocation] = BoundedLru(max_runs)

    def cached(self, run_id: str) -> Allocation | None:
        """The run's counters as this object last saw them (every field of `NUMBERED`), if it remembers them."""
        return self._cached.get(run_id)

    def remember(self, run_id: str, allocation: Allocation) -> None:
        """Remember the run's counters (after a `claim` that applied)."""
        self._cached.put(run_id, allocation)

    def forget(self, run_id: str) -> None:
        self._cached.pop(run_id)

    def claim(self, run_id: str, cached: Allocation, increments: dict[str, int]) -> Update:
        """The update adding `increments` to the run's counters if they are still `cached`, failing otherwise.

        It matches only the remembered registration and numbers (a missing field counts as 0). It
        upserts, and the document an upsert would insert changes `_id`, which the server refuses
        (error 66, or 11000 if it meets the stored document first): so an update that matches
        nothing, whether the counters moved on or the document is gone, is a write error, never a
        silent no-op.
        """
        numbers = {name: number if number else {'$in': [0, None]} for name, number in cached.last.items()}
        return Update(
            'counters',
            {'_id': run_id, 'registration': cached.registration, **numbers},
            {'$inc': increments, '$setOnInsert': {'_id': {'stale_counters_of': run_id}}},
            upsert=True,
        )

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
        self._cached.put(run_id, Allocation(registration=registration, last=dict.fromkeys(NUMBERED, 0)))

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
        allocation = Allocation(
            registration=_stored_number(document, 'registration', run_id),
            last={name: _stored_number(document, name, run_id) for name in increments},
        )
        others = {name: document.get(name, 0) for name in NUMBERED if name not in increments}
        if all(isinstance(number, int) and not isinstance(number, bool) for number in others.values()):
            self._cached.put(run_id, Allocation(allocation.registration, {**allocation.last, **others}))
        else:
            self._cached.pop(run_id)
        return allocation

    async def _increment(self, counter_id: Any, increments: dict[str, int]) -> Any:
        return await self._counters.find_one_and_update(
            {'_id': counter_id}, {'$inc': increments}, return_document=ReturnDocument.AFTER
        )

    async def delete_run(self, run_id: str) -> None:
        self._cached.pop(run_id)
        await self._counters.delete_one({'_id': run_id})
