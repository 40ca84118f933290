"""The queries over runs: `list_runs` (every filter an index serves), `find_snapshot`, and registering origins.

`list_runs` sorts on `RUN_ORDER` (reversed for `newest_first`) after one equality filter per
argument; each filter has an index that starts with it and goes on with the sort
(`conversation_started`, `parent_started`, `agent_started`, `origin_started`), so with a `limit`
the server reads only that many runs. A damaged run is skipped (logged) and the next page read, so
`limit` still counts readable runs. `find_snapshot` finds the snapshots by `history_digest` (the
`history_digest` index) and keeps those of the conversation's runs.
"""

from __future__ import annotations

from typing import Any

from pymongo import DESCENDING, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from step_persistence._arguments import require_text
from step_persistence._reading import read_each
from step_persistence.records import RunRecord, SnapshotRef
from step_persistence.stores._bare import Write, bare_record
from step_persistence.stores._listing import RunFilter
from step_persistence.stores.mongo._client import Database
from step_persistence.stores.mongo._documents import run_document, run_from_document
from step_persistence.stores.mongo._indexes import CONTINUED_ORIGIN_INDEX, is_duplicate_on
from step_persistence.stores.mongo._lifecycle import RUN_ORDER

__all__ = ['fill_bare_run', 'find_runs', 'find_snapshot', 'insert_bare_run', 'insert_run', 'run_query']

_NEWEST_FIRST = [(name, DESCENDING) for name, _ in RUN_ORDER]

_FILTERS = {
    'parent_run_id': 'parent_run_id',
    'conversation_id': 'conversation_id',
    'agent_name': 'agent_name',
    'origin_run_id': 'origin.run_id',
}
"""`list_runs` argument -> the field it matches."""


def run_query(chosen: RunFilter) -> dict[str, Any]:
    """The `runs` query of the filters given (checked by `RunFilter`); a `run_id_prefix` is a range of
    `_id` (strings compare by code point), served by its index."""
    query = {field: getattr(chosen, name) for name, field in _FILTERS.items() if getattr(chosen, name) is not None}
    if chosen.run_id_prefix:
        prefix = chosen.run_id_prefix
        above = _above_every_extension(prefix)
        query['_id'] = {'$gte': prefix} if above is None else {'$gte': prefix, '$lt': above}
    return query


def _above_every_extension(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix`, in code point order, or `None`
    when there is none (`prefix` is all U+10FFFF, so every string at least `prefix` starts with it).

    A surrogate (not encodable in BSON) is stepped over."""
    kept = prefix.rstrip(chr(0x10FFFF))
    if not kept:
        return None
    following = ord(kept[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:
        following = 0xE000
    return kept[:-1] + chr(following)


def _describe(document: dict[str, Any]) -> str:
    return f'run {document.get("_id")!r}'


async def find_runs(
    runs: AsyncCollection[dict[str, Any]],
    query: dict[str, Any],
    *,
    limit: int | None = None,
    newest_first: bool = False,
) -> list[RunRecord]:
    """The readable runs matching `query` in `list_runs` order, at most `limit`."""
    order = _NEWEST_FIRST if newest_first else RUN_ORDER
    if limit is None:
        return read_each(await runs.find(query).sort(order).to_list(None), _describe, run_from_document)
    records: list[RunRecord] = []
    skip = 0
    while True:  # pages again only past damaged runs
        wanted = limit - len(records)
        page = await runs.find(query).sort(order).skip(skip).limit(wanted).to_list(None)
        records.extend(read_each(page, _describe, run_from_document))
        if len(page) < wanted or len(records) == limit:
            return records
        skip += len(page)


async def insert_run(runs: AsyncCollection[dict[str, Any]], record: RunRecord, registration: int) -> RunRecord:
    """Insert the run's document; return the record as stored.

    A `continued` origin whose snapshot another stored run continued (the unique partial
    `continued_origin` index refuses it) is stored as `forked`. `ValueError` if the run id is taken.
    """
    try:
        await runs.insert_one(run_document(record, registration=registration))
        return record
    except DuplicateKeyError as error:
        continued = is_duplicate_on(error.details or {}, CONTINUED_ORIGIN_INDEX, ('origin.run_id', 'origin.seq'))
        if record.origin is None or not continued:
            raise ValueError(f'run {record.run_id!r} is already registered') from None
    forked = record.model_copy(update={'origin': record.origin.model_copy(update={'kind': 'forked'})})
    try:
        await runs.insert_one(run_document(forked, registration=registration))
    except DuplicateKeyError:
        raise ValueError(f'run {record.run_id!r} is already registered') from None
    return forked


async def insert_bare_run(runs: AsyncCollection[dict[str, Any]], write: Write, registration: int) -> bool:
    """Insert the document of the bare run `write` (its first write) registers; `False` if the run is stored."""
    try:
        await runs.insert_one({**run_document(bare_record(write), registration=registration), 'bare': True})
    except DuplicateKeyError:
        return False
    return True


async def fill_bare_run(runs: AsyncCollection[dict[str, Any]], record: RunRecord) -> tuple[RunRecord, int] | None:
    """Fill in the run's bare document with `record`; the record as stored and the run's `registration` (that of
    its first write), or `None` if the run is not bare. A `continued` origin is stored as `insert_run` does."""
    try:
        return await _fill(runs, record)
    except DuplicateKeyError as error:
        if record.origin is None or not is_duplicate_on(
            error.details or {}, CONTINUED_ORIGIN_INDEX, ('origin.run_id', 'origin.seq')
        ):
            raise
    return await _fill(runs, record.model_copy(update={'origin': record.origin.model_copy(update={'kind': 'forked'})}))


async def _fill(runs: AsyncCollection[dict[str, Any]], record: RunRecord) -> tuple[RunRecord, int] | None:
    fields = run_document(record, registration=0)
    del fields['_id'], fields['registration']
    filled = await runs.find_one_and_update(
        {'_id': record.run_id, 'bare': True},
        {'$set': fields, '$unset': {'bare': ''}},
        projection={'registration': 1},
        return_document=ReturnDocument.AFTER,
    )
    if filled is None:
        return None
    registration = filled.get('registration')
    if isinstance(registration, bool) or not isinstance(registration, int):
        raise ValueError(f'the document of run {record.run_id!r} is damaged (registration is {registration!r})')
    return record, registration


async def find_snapshot(database: Database, *, conversation_id: str, history_digest: str) -> SnapshotRef | None:
    """The newest retained snapshot of the conversation's runs with `history_digest` (`StepStore.find_snapshot`)."""
    require_text('conversation_id', conversation_id)
    require_text('history_digest', history_digest)
    newest: dict[str, int] = {}
    async for document in database['snapshots'].find(
        {'history_digest': history_digest}, {'_id': 0, 'run_id': 1, 'seq': 1}
    ):
        run_id, seq = document.get('run_id'), document.get('seq')
        if isinstance(run_id, str) and isinstance(seq, int) and not isinstance(seq, bool):
            newest[run_id] = max(seq, newest.get(run_id, seq))
    if not newest:
        return None
    candidates = database['runs'].find({'_id': {'$in': list(newest)}}).sort(_NEWEST_FIRST)
    for record in read_each(await candidates.to_list(None), _describe, run_from_document):
        if record.conversation_id == conversation_id:
            return SnapshotRef(run_id=record.run_id, seq=newest[record.run_id])
    return None
