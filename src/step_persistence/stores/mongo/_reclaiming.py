"""Reclaiming message documents on MongoDB: what `delete_run` releases and what `collect_media` collects.

A message document is used while some view uses it (`stores/_positions.py`): the view of a
retained snapshot, or the base of a line (a branch keeps the view it starts from). A version is
reclaimed by turning it into a tombstone `{line, no, run_id, reclaimed: true}` (its body and
position go), so its number stays claimed and appending stays safe (`_histories.py`); a line
that goes whole takes its documents and tombstones with it. On a legacy line (never appended to)
versions are deleted outright.

- `release_lines` (`delete_run`, before the run's documents go): for each line the run's snapshots
  are on, a line left with no other snapshot's view and no branch goes whole, and then its base
  line is looked at the same way; otherwise the versions no remaining view uses go, except those
  numbered above the deleted run's own highest `through` on the line (a save still in flight may
  be about to name them).
- `collect_media`: every version no view uses, and every line without views or branches, once
  older than `grace` (an `ObjectId`'s time, the writer's clock): MongoDB writes a save's message
  documents before its snapshot document, without a transaction, and the grace covers the save
  in between. With `grace` zero nothing is protected. Blobs are then collected through the store's
  media store (`collect_blobs`), the URIs in the remaining externalized documents being the
  references.

Neither protects a view that a save is building on at that very moment when that view's own
snapshot is deleted or pruned meanwhile (continuing a run while it is being deleted): see
docs/mongo.md.

Damaged documents never stop a collection: a message whose line, position or number is not what
the store writes, or whose `_id` is not an `ObjectId` (so its age is unknown), is left alone, and a
snapshot or line whose view fields are damaged (unreadable anyway) protects nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from bson import ObjectId

from step_persistence.media.protocol import MediaStore
from step_persistence.reclaiming import MediaCollection, collect_blobs, uris_in, validate_grace
from step_persistence.records import utc_now
from step_persistence.stores._positions import LineBase
from step_persistence.stores.mongo._client import JOURNAL_UNITS, Database
from step_persistence.stores.mongo._documents import StoredView, stored_view
from step_persistence.stores.mongo._lines import (
    base_from_document,
    check_line,
    is_legacy,
    legacy_line,
    line_key,
    line_made_at,
    line_messages,
    line_snapshots,
    on_line,
)

__all__ = ['collect_media', 'release_lines']

_BATCH: Final = 1000

_TOMBSTONE: Final = {
    '$set': {'reclaimed': True},
    '$unset': {'position': '', 'digest': '', 'body': '', 'externalized': '', 'stored_digest': ''},
}

_VIEW_FIELDS: Final = {'_id': 0, 'run_id': 1, 'line': 1, 'history_length': 1, 'through_message': 1, 'history_digest': 1}

Use = tuple[int, int]
"""A view's `(length, through)` on one line."""


@dataclass(frozen=True, slots=True)
class _Version:
    position: int
    no: int
    id: ObjectId


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _view(document: dict[str, Any]) -> StoredView | None:
    """The view of a snapshot document, `None` for a tombstone or damaged fields."""
    if 'history_length' not in document:
        return None
    try:
        return stored_view(document)
    except ValueError:
        return None


def _message_line(document: dict[str, Any]) -> str | None:
    """The line a message document is on (`None`: damaged)."""
    if 'line' not in document:
        run_id = document.get('run_id')
        return legacy_line(run_id) if isinstance(run_id, str) and run_id else None
    try:
        return check_line(document['line'])
    except ValueError:
        return None


def unused(versions: Iterable[_Version], uses: Iterable[Use]) -> list[_Version]:
    """The versions of one line that no use `(length, through)` reads: the newest at a position below
    `length` numbered at most `through` is used."""
    by_position: defaultdict[int, list[_Version]] = defaultdict(list)
    for version in versions:
        by_position[version.position].append(version)
    uses = sorted(set(uses), key=lambda use: use[1])
    found: list[_Version] = []
    for position, candidates in by_position.items():
        candidates.sort(key=lambda version: version.no)
        used: set[int] = set()
        index = 0
        for length, through in uses:  # by increasing `through`: each reads the newest candidate up to it
            while index < len(candidates) and candidates[index].no <= through:
                index += 1
            if length > position and index:
                used.add(candidates[index - 1].no)
        found.extend(version for version in candidates if version.no not in used)
    return found


async def _release(messages: Any, line: str, versions: list[_Version]) -> int:
    """Reclaim `versions` of `line` (tombstones; deleted on a legacy line); how many were reclaimed."""
    reclaimed = 0
    for start in range(0, len(versions), _BATCH):
        batch = {'_id': {'$in': [version.id for version in versions[start : start + _BATCH]]}}
        if is_legacy(line):
            reclaimed += (await messages.delete_many(batch)).deleted_count
        else:
            reclaimed += (
                await messages.update_many({**batch, 'reclaimed': {'$exists': False}}, _TOMBSTONE)
            ).modified_count
    return reclaimed


# --- delete_run ---


async def release_lines(database: Database, run_id: str) -> None:
    """Release the message documents of the lines run `run_id`'s snapshots are on, as if those snapshots were gone.

    On a line still in use, only the versions numbered above the newest remaining view at or below
    the run's highest `through` there are judged: the ones that view reaches were judged when the
    views using them went (what only the deleted run used below it, after a rewound history, waits
    for `collect_media`). So deleting a chat's newest turn reads that turn's documents only, and
    deleting a conversation newest first is linear. Call before the run's snapshots are deleted, so
    that an interrupted delete can be run again.
    """
    snapshots = database['snapshots']
    bounds: dict[str, int] = {}
    async for document in snapshots.find({'run_id': run_id}, _VIEW_FIELDS):
        view = _view(document)
        if view is not None and view.line is not None:
            bounds[view.line] = max(bounds.get(view.line, 0), view.through)
    queue = list(bounds.items())
    while queue:
        line, bound = queue.pop()
        bases = [
            base
            async for document in database['lines'].find({'base.line': line}, {'base': 1})
            if (base := _readable_base(document)) is not None
        ]
        below = await _newest_view_up_to(snapshots, line, bound, besides=run_id)
        floor = max([below or 0, *(base.through for base in bases if base.through <= bound)])
        uses = [(base.length, base.through) for base in bases if base.through > floor]
        async for document in snapshots.find({**line_snapshots(line), 'through_message': {'$gt': floor}}, _VIEW_FIELDS):
            view = _view(document)
            if document.get('run_id') != run_id and view is not None and view.line == line:
                uses.append((view.length, view.through))
        if uses or below is not None or bases:
            await _release_above(database['messages'], line, floor, bound, uses)
            continue
        removed = await _remove_line(database, line)
        if removed is not None:
            queue.append((str(removed.line), removed.through))


async def _newest_view_up_to(snapshots: Any, line: str, bound: int, *, besides: str) -> int | None:
    """The highest `through` at most `bound` of a view on `line` that is not run `besides`'s (`None`: none)."""
    query = {**line_snapshots(line), 'through_message': {'$lte': bound}}
    async for document in snapshots.find(query, _VIEW_FIELDS).sort('through_message', -1):
        view = _view(document)
        if document.get('run_id') != besides and view is not None and view.line == line:
            return view.through
    return None


async def _release_above(messages: Any, line: str, floor: int, bound: int, uses: list[Use]) -> None:
    """Reclaim the versions of `line` numbered in `(floor, bound]` that none of `uses` reads."""
    if floor >= bound:
        return
    query = {**line_key(line), 'no': {'$gt': floor, '$lt': bound + 1}}  # not `$lte`: see docs/mongo.md, testing
    versions = [
        version
        async for document in messages.find(query, {'line': 1, 'position': 1, 'no': 1, 'reclaimed': 1})
        if on_line(document, line) and 'reclaimed' not in document and (version := _version(document)) is not None
    ]
    await _release(messages, line, unused(versions, uses))


def _readable_base(document: dict[str, Any]) -> LineBase | None:
    try:
        return base_from_document(document)
    except ValueError:
        return None


def _version(document: dict[str, Any]) -> _Version | None:
    position, number, identifier = _integer(document.get('position')), _integer(document.get('no')), document['_id']
    if position is None or number is None or not isinstance(identifier, ObjectId):
        return None
    return _Version(position, number, identifier)


async def _remove_line(database: Database, line: str) -> LineBase | None:
    """Delete a line's message documents, then its `lines` document; return its base."""
    await database['messages'].delete_many(line_messages(line))
    if is_legacy(line):
        return None
    document = await database['lines'].find_one_and_delete({'_id': line})
    return None if document is None else _readable_base(document)


# --- collect_media ---


@dataclass
class _Line:
    """What `collect_media` learnt of one line."""

    versions: list[_Version] = field(default_factory=list[_Version])
    """Versions with a body (reclaimable)."""
    documents: list[ObjectId] = field(default_factory=list[ObjectId])
    """Every document of the line (tombstones included)."""
    uses: list[Use] = field(default_factory=list[Use])
    """Views of retained snapshots on the line."""
    base: LineBase | None = None
    has_document: bool = False
    """Whether the line has a `lines` document."""


async def _survey(database: Database) -> defaultdict[str, _Line]:
    found: defaultdict[str, _Line] = defaultdict(_Line)
    async for document in database['snapshots'].find({}, _VIEW_FIELDS):
        view = _view(document)
        if view is not None and view.line is not None:
            found[view.line].uses.append((view.length, view.through))
    async for document in database['lines'].find({}):
        if not isinstance(document['_id'], str):
            continue
        try:
            line = check_line(document['_id'])
        except ValueError:
            continue
        found[line].has_document = True
        found[line].base = _readable_base(document)
    fields = {'line': 1, 'run_id': 1, 'position': 1, 'no': 1, 'reclaimed': 1}
    async for document in database['messages'].find({}, fields):
        on = _message_line(document)
        if on is None or not isinstance(document['_id'], ObjectId) or _integer(document.get('no')) is None:
            continue  # damaged: whose it is, or how old, is not known
        found[on].documents.append(document['_id'])
        version = _version(document)
        if version is not None and 'reclaimed' not in document:
            found[on].versions.append(version)
    return found


def _old(identifier: ObjectId, cutoff: ObjectId | None) -> bool:
    return cutoff is None or identifier < cutoff


def _removable(name: str, line: _Line, children: int, cutoff: ObjectId | None) -> bool:
    """Whether a line goes whole: no views, no branches, made and written before the cutoff."""
    if line.uses or children:
        return False
    made = line_made_at(name)
    if cutoff is not None and made is not None and made >= cutoff.generation_time:
        return False
    return all(_old(identifier, cutoff) for identifier in line.documents)


async def _collect_messages(database: Database, cutoff: ObjectId | None) -> int:
    lines = await _survey(database)
    children: defaultdict[str, int] = defaultdict(int)
    for line in lines.values():
        if line.base is not None:
            children[str(line.base.line)] += 1
    gone: set[str] = set()
    changed = True
    while changed:  # a line that goes may leave its base without branches
        changed = False
        for name, line in list(lines.items()):
            if name not in gone and _removable(name, line, children[name], cutoff):
                gone.add(name)
                changed = True
                if line.base is not None:
                    children[str(line.base.line)] -= 1
    reclaimed = 0
    messages = database['messages']
    for name in gone:
        line = lines[name]
        reclaimed += len(line.versions)
        for start in range(0, len(line.documents), _BATCH):
            await messages.delete_many({'_id': {'$in': line.documents[start : start + _BATCH]}})
        if line.has_document:
            await database['lines'].delete_one({'_id': name})
    bases = [line.base for name, line in lines.items() if name not in gone and line.base is not None]
    for base in bases:  # a branch keeps the view it starts from
        lines[str(base.line)].uses.append((base.length, base.through))
    for name, line in list(lines.items()):
        if name in gone:
            continue
        old = [version for version in unused(line.versions, line.uses) if _old(version.id, cutoff)]
        reclaimed += await _release(messages, name, old)
    return reclaimed


async def collect_media(database: Database, media_store: MediaStore | None, *, grace: timedelta) -> MediaCollection:
    """Reclaim unused message documents older than `grace`, then the blobs no remaining message refers to."""
    grace = validate_grace(grace)
    cutoff = None if grace == timedelta(0) else ObjectId.from_datetime(utc_now() - grace)
    reclaimed = await _collect_messages(database, cutoff)
    messages = database['messages']

    async def referenced() -> set[str]:
        found: set[str] = set()
        async for document in messages.find({'externalized': True}, {'_id': 0, 'body': 1}):
            body = document.get('body')
            if isinstance(body, str):
                found |= uris_in(body)
        # The durable journal's unit results that hold media markers.
        async for document in database[JOURNAL_UNITS].find({'externalized': True}, {'_id': 0, 'result': 1}):
            result = document.get('result')
            if isinstance(result, str):
                found |= uris_in(result)
        return found

    blobs = await collect_blobs(media_store, grace=grace, referenced=referenced)
    return MediaCollection(messages=reclaimed, blobs=blobs)
