"""`collect_media` for `MongoStepStore`: unused message documents, then unreferenced blobs.

Per run, a message document is kept while it is its position's newest version (the next save of
the run may reuse it) or a snapshot of the run uses it: the snapshot's `history_length` covers
its position and its `through_message` lies between the document's number and the next version's.
Messages of runs that no longer exist (an interrupted `delete_run`) go too. MongoDB writes the
message documents of a save before its snapshot document, without a transaction, and a save may
plan its snapshot on a version that another writer supersedes before the snapshot document is
in: so a version is deleted only once it was superseded more than `grace` ago (the newer
version's `ObjectId` time, the writer's clock), and a dead run's documents only when older than
`grace`. With `grace` zero, nothing is protected.

Blobs are then collected through the store's media store (`collect_blobs`), with the URIs written
in the remaining externalized message documents as the references.

Damaged documents never stop a collection: a message whose run id, position or number is not what
the store writes, or whose `_id` is not an `ObjectId` (so its age is unknown), is left alone, and a
snapshot whose history fields are damaged (unreadable anyway) protects nothing.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from itertools import pairwise
from typing import Any

from bson import ObjectId

from step_persistence.media.protocol import MediaStore
from step_persistence.reclaiming import MediaCollection, collect_blobs, uris_in, validate_grace
from step_persistence.records import utc_now
from step_persistence.stores.mongo._client import Database

__all__ = ['collect_media']

_BATCH = 1000


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _unused(versions: list[tuple[int, int, Any]], uses: list[tuple[int, int]], cutoff: ObjectId | None) -> list[Any]:
    """The `_id`s of `versions` (a run's `(position, no, _id)`) that no snapshot `(length, through)` uses.

    A version is a candidate only once a newer version of its position exists, and (with a
    `cutoff`) that newer one was written before the cutoff: a save in flight may have planned its
    snapshot with the older version before the newer one was written.
    """
    versions = sorted(versions, key=lambda version: (version[0], version[1]))
    unused: list[Any] = []
    for (position, number, identifier), following in pairwise(versions):
        if following[0] != position or (cutoff is not None and following[2] >= cutoff):
            continue
        next_number = following[1]
        if not any(length > position and number <= through < next_number for length, through in uses):
            unused.append(identifier)
    return unused


async def _delete(collection: Any, identifiers: list[Any]) -> int:
    deleted = 0
    for start in range(0, len(identifiers), _BATCH):
        result = await collection.delete_many({'_id': {'$in': identifiers[start : start + _BATCH]}})
        deleted += result.deleted_count
    return deleted


async def collect_media(database: Database, media_store: MediaStore | None, *, grace: timedelta) -> MediaCollection:
    """Delete unused message documents older than `grace`, then the blobs no remaining message refers to."""
    grace = validate_grace(grace)
    messages, snapshots, runs = database['messages'], database['snapshots'], database['runs']
    cutoff = None if grace == timedelta(0) else ObjectId.from_datetime(utc_now() - grace)
    live = {document['_id'] async for document in runs.find({}, {'_id': 1}) if isinstance(document['_id'], str)}
    uses: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
    async for document in snapshots.find({}, {'_id': 0, 'run_id': 1, 'history_length': 1, 'through_message': 1}):
        run_id = document.get('run_id')
        length, through = _integer(document.get('history_length')), _integer(document.get('through_message'))
        if isinstance(run_id, str) and length is not None and through is not None:
            uses[run_id].append((length, through))
    versions: defaultdict[str, list[tuple[int, int, Any]]] = defaultdict(list)
    doomed: list[Any] = []
    async for document in messages.find({}, {'run_id': 1, 'position': 1, 'no': 1}):
        run_id, identifier = document.get('run_id'), document['_id']
        position, number = _integer(document.get('position')), _integer(document.get('no'))
        if not isinstance(run_id, str) or not isinstance(identifier, ObjectId):
            continue  # damaged: whose it is, or how old, is not known
        if run_id not in live:
            if cutoff is None or identifier < cutoff:
                doomed.append(identifier)  # left by an interrupted delete_run
        elif position is not None and number is not None:
            versions[run_id].append((position, number, identifier))
    for run_id, found in versions.items():
        doomed.extend(_unused(found, uses[run_id], cutoff))
    reclaimed = await _delete(messages, doomed)

    async def referenced() -> set[str]:
        found: set[str] = set()
        async for document in messages.find({'externalized': True}, {'_id': 0, 'body': 1}):
            body = document.get('body')
            if isinstance(body, str):
                found |= uris_in(body)
        return found

    blobs = await collect_blobs(media_store, grace=grace, referenced=referenced)
    return MediaCollection(messages=reclaimed, blobs=blobs)
