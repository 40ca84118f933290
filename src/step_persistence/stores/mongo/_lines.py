"""History lines on MongoDB: their ids, which documents belong to one, and the bases of branches.

A line id is the hex string of a fresh `ObjectId` (so it is never reused, and tells when the line
was made). The message documents of a run written before lines existed (numbered per run: a
`run_id`, no `line`) are read as that run's *legacy line* `run:<run_id>`; snapshots written then
(no `line` field) are views of it. A legacy line is read like any other but never appended to: a
save that builds on one branches.

A line that branches from another view has a `lines` document `{_id: line, base: {line, length,
through}}` (`stores/_positions.LineBase`), written before any of its messages; a line without a
base has none. A base never changes, so `LineBases` remembers the ones it read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from bson import ObjectId

from step_persistence._lru import BoundedLru
from step_persistence.stores._positions import LineBase, LineId, ViewSegment, view_segments
from step_persistence.stores.mongo._client import Database
from step_persistence.stores.mongo._indexes import LINE_INDEXES, IndexSetup

__all__ = [
    'LEGACY_PREFIX',
    'LineBases',
    'as_line',
    'base_from_document',
    'check_line',
    'fresh_line',
    'is_legacy',
    'legacy_line',
    'line_key',
    'line_made_at',
    'line_messages',
    'line_snapshots',
    'on_line',
]

LEGACY_PREFIX: Final = 'run:'
"""How a legacy line's id starts; no fresh line id (24 hex digits) contains the colon."""

_FRESH: Final = re.compile(r'[0-9a-f]{24}')


def fresh_line() -> str:
    """A new line id, never handed out before."""
    return str(ObjectId())


def as_line(line: LineId | None) -> str | None:
    """A line id of the shared model as this store spells it (always a string here)."""
    return None if line is None else str(line)


def legacy_line(run_id: str) -> str:
    """The line of the message documents run `run_id` numbered before lines existed."""
    return f'{LEGACY_PREFIX}{run_id}'


def is_legacy(line: str) -> bool:
    return line.startswith(LEGACY_PREFIX)


def check_line(value: object) -> str:
    """A stored line id, checked: `ValueError` for anything this store does not write."""
    if isinstance(value, str) and (_FRESH.fullmatch(value) or (is_legacy(value) and len(value) > len(LEGACY_PREFIX))):
        return value
    raise ValueError(f'a line id must be 24 hex digits or {LEGACY_PREFIX}<run id>, got {value!r}')


def line_made_at(line: str) -> datetime | None:
    """When a fresh line was made (its id's time, the writer's clock); `None` for a legacy line."""
    return None if is_legacy(line) else ObjectId(line).generation_time


def line_key(line: str) -> dict[str, Any]:
    """The indexed part of the query selecting the message documents of `line` (`line_messages`):
    `line` (index `line_position_no`), or for a legacy line its run (`run_position_no`).

    Queries put it first and filter on the rest afterwards, so that even a simple query planner
    (the test server's) reads through the index.
    """
    return {'run_id': line[len(LEGACY_PREFIX) :]} if is_legacy(line) else {'line': line}


def line_messages(line: str) -> dict[str, Any]:
    """The query selecting the message documents of `line`."""
    return {**line_key(line), 'line': {'$exists': False}} if is_legacy(line) else line_key(line)


def on_line(document: Mapping[str, Any], line: str) -> bool:
    """Whether a message document that `line_key(line)` found is on `line` (`line_messages`)."""
    return 'line' not in document if is_legacy(line) else document.get('line') == line


def line_snapshots(line: str) -> dict[str, Any]:
    """The query selecting the snapshot documents whose view is on `line`."""
    if is_legacy(line):
        return {'$or': [{'run_id': line[len(LEGACY_PREFIX) :], 'line': {'$exists': False}}, {'line': line}]}
    return {'line': line}


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f'a line base {name} must be an integer of at least 0, got {value!r}')
    return value


def base_from_document(document: Mapping[str, Any]) -> LineBase | None:
    """The base a `lines` document records (`None`: it has none); `ValueError` if it is damaged."""
    base = document.get('base')
    if base is None:
        return None
    if not isinstance(base, Mapping):
        raise ValueError(f'a line base must be an embedded document, got {base!r}')
    return LineBase(
        line=check_line(base.get('line')),
        length=_count(base.get('length'), 'length'),
        through=_count(base.get('through'), 'through'),
    )


class LineBases:
    """Reads (and remembers) line bases; writes the `lines` document of a new branch."""

    def __init__(self, database: Database, *, max_lines: int = 4096) -> None:
        self._lines = database['lines']
        self._index = IndexSetup(database, LINE_INDEXES)
        self._known: BoundedLru[str, LineBase | None] = BoundedLru(max_lines)

    async def segments(self, line: str, length: int, through: int) -> list[ViewSegment]:
        """The segments a view on `line` reads (`view_segments`), its bases read as needed.

        Raises `ValueError` for a damaged `lines` document or bases forming a cycle.
        """
        bases: dict[str, LineBase | None] = {}
        current: str | None = line
        while current is not None and current not in bases:
            base = await self.base_of(current)
            bases[current] = base
            current = None if base is None else str(base.line)
        return view_segments(line, length, through, lambda of: bases[str(of)])

    async def base_of(self, line: str) -> LineBase | None:
        """The base of `line` (`None`: it has none, or it has no `lines` document)."""
        if is_legacy(line):
            return None
        if line in self._known:
            return self._known.get(line)
        document = await self._lines.find_one({'_id': line})
        base = None if document is None else base_from_document(document)
        self._known.put(line, base)
        return base

    async def create_index(self) -> None:
        """Create the index of `lines` unless this object did (a branch does it first otherwise)."""
        await self._index.ensure()

    async def branch(self, base: LineBase) -> str:
        """A new line starting from view `base`, its `lines` document written (before any of its messages)."""
        await self.create_index()
        line = fresh_line()
        await self._lines.insert_one(
            {'_id': line, 'base': {'line': base.line, 'length': base.length, 'through': base.through}}
        )
        self._known.put(line, base)
        return line
