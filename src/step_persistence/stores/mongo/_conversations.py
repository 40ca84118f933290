"""The `conversations` collection: one summary per conversation, kept at register and delete, for `list_conversations`.

A summary is `{_id: conversation_id, first: key, last: key}`, where a run's key is
`{at, us, registration, run_id}` (its `started_at` as a millisecond date plus micros, its
registration number, its id): MongoDB compares embedded documents field by field, so `$min` and
`$max` of keys keep the conversation's oldest and newest run (`list_runs` order) atomically, in
any order and any number of times. `last_started` (`(last.at, last.us, _id)`) serves
`list_conversations(limit=...)` newest (or oldest) first; the page's run counts come from one
aggregation over the runs' `conversation_started` index, so they are exact.

- Registering a run `$min`/`$max`es its key into its conversation's summary; one that creates the
  summary reads the conversation's oldest and newest run too (repairing a summary lost to an
  interrupted write).
- Deleting a run (before its `runs` document goes, so an interrupted delete can be redone)
  replaces it where it was the first or last run, with the next one found in `runs`, only if the
  summary still names it; a conversation left with no run loses its summary.
- A database written before summaries existed gets them built from `runs` by the first write of
  a store (`build`, recorded in `counters` as done); until then `list_conversations` aggregates
  `runs` instead. `agent_name=` always aggregates the agent's runs (`agent_started` index).

Without transactions this is best effort where writes race or are interrupted (see docs/mongo.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final

from pymongo import ASCENDING, DESCENDING, UpdateOne
from pymongo.errors import DuplicateKeyError

from step_persistence._reading import read_or_skip
from step_persistence.records import ConversationSummary, RunRecord
from step_persistence.stores.mongo._client import Database, aggregate_all, upsert
from step_persistence.stores.mongo._documents import with_time
from step_persistence.stores.mongo._indexes import CONVERSATION_INDEXES, IndexSetup
from step_persistence.stores.mongo._lifecycle import RUN_ORDER

__all__ = ['Conversations']

_BUILT: Final = {'summary': 'conversations'}
"""The `counters` document recording that summaries were built (no run id can equal it)."""

_KEY: Final = {'at': '$started_at', 'us': '$started_at_us', 'registration': '$registration', 'run_id': '$_id'}
"""A run's key, as an aggregation expression over its `runs` document."""

_KEYED: Final = {
    'conversation_id': {'$type': 'string'},
    'started_at': {'$type': 'date'},
    'started_at_us': {'$type': 'number'},
    'registration': {'$type': 'number'},
}
"""Runs of a conversation whose key is readable (a damaged run takes no part in summaries)."""


def _keyed(document: Mapping[str, Any]) -> bool:
    """Whether a `runs` document read with `_KEY_FIELDS` has a readable key (`_KEYED`, checked here)."""
    numbers = [document.get(name) for name in ('started_at_us', 'registration')]
    return (
        isinstance(document.get('started_at'), datetime)
        and all(isinstance(number, int) and not isinstance(number, bool) for number in numbers)
        and isinstance(document['_id'], str)
    )


_NEWEST_FIRST: Final = [('last.at', DESCENDING), ('last.us', DESCENDING), ('_id', DESCENDING)]
_OLDEST_FIRST: Final = [('last.at', ASCENDING), ('last.us', ASCENDING), ('_id', ASCENDING)]


def _key(record: RunRecord, registration: int) -> dict[str, Any]:
    stamped = with_time({}, 'started_at', record.started_at)
    return {
        'at': stamped['started_at'],
        'us': stamped['started_at_us'],
        'registration': registration,
        'run_id': record.run_id,
    }


def _stored_key(document: Mapping[str, Any]) -> dict[str, Any]:
    """The key of a `runs` document (read with `_KEY_FIELDS`)."""
    return {
        'at': document['started_at'],
        'us': document['started_at_us'],
        'registration': document['registration'],
        'run_id': document['_id'],
    }


_KEY_FIELDS: Final = {'started_at': 1, 'started_at_us': 1, 'registration': 1}


def _started(key: Any) -> tuple[datetime, str]:
    """`(started_at, run_id)` of a stored key; `ValueError` if damaged."""
    if not isinstance(key, Mapping):
        raise ValueError(f'a run key must be an embedded document, got {key!r}')
    at, us, registration, run_id = (key.get(name) for name in ('at', 'us', 'registration', 'run_id'))
    if not isinstance(at, datetime) or isinstance(us, bool) or not isinstance(us, int) or not 0 <= us < 1000:
        raise ValueError(f'a run key must hold a date and its micros, got {at!r} and {us!r}')
    if isinstance(registration, bool) or not isinstance(registration, int) or not isinstance(run_id, str):
        raise ValueError(f'a run key must hold a registration number and a run id, got {registration!r}, {run_id!r}')
    return at.astimezone(UTC) + timedelta(microseconds=us), run_id


def _summary(document: Mapping[str, Any], count: int) -> ConversationSummary:
    first, _ = _started(document.get('first'))
    last, head = _started(document.get('last'))
    return ConversationSummary(
        conversation_id=document['_id'], first_started_at=first, last_started_at=last, run_count=count, head_run_id=head
    )


class Conversations:
    """Keeps and reads the conversation summaries of one database (see the module docstring)."""

    def __init__(self, database: Database) -> None:
        self._summaries = database['conversations']
        self._runs = database['runs']
        self._counters = database['counters']
        self._index = IndexSetup(database, CONVERSATION_INDEXES)
        self._built = False

    # --- keeping ---

    async def create_index(self) -> None:
        """Create the index of `conversations` unless this object did (writing a summary does it first otherwise)."""
        await self._index.ensure()

    async def build(self) -> None:
        """Build the summaries from `runs` unless that was done (a database written before they existed)."""
        if await self._counters.find_one({'_id': _BUILT}) is None:
            found = await self._from_runs({})
            if found:
                await self.create_index()
            updates = [
                UpdateOne(
                    {'_id': group['_id']},
                    {'$min': {'first': group['first']}, '$max': {'last': group['last']}},
                    upsert=True,
                )
                for group in found
            ]
            for start in range(0, len(updates), 1000):
                await self._summaries.bulk_write(updates[start : start + 1000], ordered=False)
            with contextlib.suppress(DuplicateKeyError):
                await self._counters.insert_one({'_id': _BUILT})
        self._built = True

    async def added(self, record: RunRecord, registration: int) -> None:
        """Count a run just registered in its conversation's summary."""
        if record.conversation_id is None:
            return
        await self._widen(record.conversation_id, _key(record, registration))

    async def _widen(self, conversation_id: str, key: dict[str, Any]) -> None:
        await self.create_index()
        result = await upsert(
            lambda: self._summaries.update_one(
                {'_id': conversation_id}, {'$min': {'first': key}, '$max': {'last': key}}, upsert=True
            )
        )
        if result.upserted_id is None:
            return
        for order in (ASCENDING, DESCENDING):  # a new summary: are there older (or newer) runs it missed?
            end = await self._end(conversation_id, order)
            if end is not None and end['run_id'] != key['run_id']:
                await self._summaries.update_one(
                    {'_id': conversation_id},
                    {'$min': {'first': end}} if order == ASCENDING else {'$max': {'last': end}},
                )

    async def removing(self, run_id: str, conversation_id: str) -> None:
        """Take a run about to be deleted out of its conversation's summary."""
        summary = await self._summaries.find_one({'_id': conversation_id})
        if summary is None:
            return
        ends = [
            name
            for name in ('first', 'last')
            if isinstance(summary.get(name), Mapping) and summary[name].get('run_id') == run_id
        ]
        for name in ends:
            end = await self._end(conversation_id, ASCENDING if name == 'first' else DESCENDING, besides=run_id)
            if end is None:
                await self._summaries.delete_one({'_id': conversation_id, name: summary[name]})
                return
            await self._summaries.update_one({'_id': conversation_id, name: summary[name]}, {'$set': {name: end}})

    async def _end(self, conversation_id: str, order: int, *, besides: str | None = None) -> dict[str, Any] | None:
        """The key of the conversation's oldest (`ASCENDING`) or newest run (but `besides`), or `None`."""
        sort = [(name, order) for name, _ in RUN_ORDER]
        query = self._runs.find({'conversation_id': conversation_id}, _KEY_FIELDS).sort(sort)
        for limit in (3, 0):  # then all of them: only past damaged runs
            found = await query.clone().limit(limit).to_list(None)
            for document in found:
                if document['_id'] != besides and _keyed(document):
                    return _stored_key(document)
            if len(found) < 3:
                return None
        return None

    # --- reading ---

    async def summaries(
        self, *, limit: int | None, newest_first: bool, agent_name: str | None
    ) -> list[ConversationSummary]:
        """`list_conversations` (arguments already checked)."""
        if agent_name is not None:
            return self._ordered(await self._from_runs({'agent_name': agent_name}), limit, newest_first)
        if not self._built:
            self._built = await self._counters.find_one({'_id': _BUILT}) is not None
            if not self._built:
                return self._ordered(await self._from_runs({}), limit, newest_first)
        order = _NEWEST_FIRST if newest_first else _OLDEST_FIRST
        summaries: list[ConversationSummary] = []
        skip = 0
        while True:  # pages again only past summaries that were damaged or left without runs
            wanted = None if limit is None else limit - len(summaries)
            cursor = self._summaries.find({}).sort(order).skip(skip)
            page = await (cursor if wanted is None else cursor.limit(wanted)).to_list(None)
            summaries.extend(await self._counted(page))
            if wanted is None or len(page) < wanted or len(summaries) == limit:
                return summaries
            skip += len(page)

    async def _counted(self, page: Sequence[dict[str, Any]]) -> list[ConversationSummary]:
        """The summaries of `page` with their run counts; damaged ones (logged) and emptied ones left out."""
        ids = [document['_id'] for document in page if isinstance(document['_id'], str)]
        counts = {
            group['_id']: group['n']
            for group in await aggregate_all(
                self._runs,
                [
                    {'$match': {'conversation_id': {'$in': ids}}},
                    {'$group': {'_id': '$conversation_id', 'n': {'$sum': 1}}},
                ],
            )
        }
        built = [
            read_or_skip(f'summary {document["_id"]!r}', partial(_summary, document, counts[document['_id']]))
            for document in page
            if counts.get(document['_id'])
        ]
        return [summary for summary in built if summary is not None]

    async def _from_runs(self, match: dict[str, Any]) -> list[dict[str, Any]]:
        """Per conversation among the runs matching `match` (one indexed equality, or none):
        `{_id, n, first, last}` from one aggregation."""
        return await aggregate_all(
            self._runs,
            [
                *([{'$match': match}] if match else []),
                {'$match': _KEYED},
                {'$sort': dict(RUN_ORDER)},
                {
                    '$group': {
                        '_id': '$conversation_id',
                        'n': {'$sum': 1},
                        'first': {'$first': _KEY},
                        'last': {'$last': _KEY},
                    }
                },
            ],
        )

    @staticmethod
    def _ordered(groups: list[dict[str, Any]], limit: int | None, newest_first: bool) -> list[ConversationSummary]:
        built = [
            read_or_skip(f'conversation {group["_id"]!r}', partial(_summary, group, group['n'])) for group in groups
        ]
        summaries = [summary for summary in built if summary is not None]
        summaries.sort(key=lambda summary: (summary.last_started_at, summary.conversation_id), reverse=newest_first)
        return summaries[:limit]
