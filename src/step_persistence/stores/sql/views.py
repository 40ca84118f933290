"""Reading a view of a history line: its rows, one query per line of the view's chain of bases.

A view `(line, length, through)` (a snapshot's, or a line's base) reads message `i` from the
newest row of `line` at position `i` numbered at most `through`, else from the line's base view,
and so on down the chain (`stores/_positions.py`: `view_segments`, `assemble`). Here each
segment is one query over `ix_messages_line_id_position_no`, and the chain comes from
`history_lines` by primary key, each line read once per transaction (`LineBases`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from step_persistence._history import history_digest
from step_persistence._reading import logger
from step_persistence.stores._positions import LineBase, LineId, ViewSegment, assemble, view_segments
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.rows import StoredHistory
from step_persistence.stores.sql.schema import history_lines, messages

__all__ = ['LineBases', 'segment_query', 'view_rows']

_LINE = select(history_lines.c.base_line_id, history_lines.c.base_length, history_lines.c.base_through).where(
    history_lines.c.id == bindparam('line')
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class LineBases:
    """`base_of` for `view_segments`: the base of each line, read once per transaction.

    A line whose row is missing, or whose base is damaged (set in part, or not made of integers
    from 0: SQLite keeps any value in any column), is read as having none (logged): its own rows
    still make the views that need no base, and a view that needs one finds positions missing.
    """

    def __init__(self, transaction: Transaction) -> None:
        self._transaction = transaction
        self._known: dict[LineId, LineBase | None] = {}

    def __call__(self, line: LineId) -> LineBase | None:
        if line in self._known:
            return self._known[line]
        found = rows.fetch(self._transaction, _LINE, {'line': line})
        stored: tuple[Any, Any, Any] = tuple(found[0]) if found else (None, None, None)
        base_line, length, through = stored
        base = None
        if _is_int(base_line) and _is_int(length) and _is_int(through) and length >= 0 and through >= 0:
            base = LineBase(line=base_line, length=length, through=through)
        elif not found or (base_line, length, through) != (None, None, None):
            logger.warning('history line %r is read without a base: its row holds %r', line, found[:1])
        self._known[line] = base
        return base


def segment_query(*columns: ColumnElement[Any]) -> Select[Any]:
    """`(position, *columns)` of the newest row per position of one segment, in position order; parameters
    `line`, `length` and `through` (`ViewSegment`). Build it once per set of columns."""
    newest = (
        select(messages.c.position, func.max(messages.c.no).label('no'))
        .where(
            messages.c.line_id == bindparam('line'),
            messages.c.position >= 0,
            messages.c.position < bindparam('length'),
            messages.c.no <= bindparam('through'),
        )
        .group_by(messages.c.position)
        .subquery('newest')
    )
    return (
        select(messages.c.position, *columns)
        .join_from(messages, newest, and_(messages.c.line_id == bindparam('line'), messages.c.no == newest.c.no))
        .order_by(messages.c.position)
    )


def view_rows(transaction: Transaction, history: StoredHistory, query: Select[Any], bases: LineBases) -> Sequence[Any]:
    """The rows of `query` (a `segment_query` whose second column is the digest) that make up `history`, one
    per position, in position order.

    A row whose position is not an integer (damaged behind the store's back) belongs to no view.
    Raises `ValueError` naming the first position no segment has (rows damaged or removed), for a
    chain of bases that loops (`view_segments`), or when the rows' digests are not the history's
    `history_digest` (rows of another history: a damaged reference).
    """
    if history.length == 0:
        return []
    if history.line is None:
        raise ValueError(f'a history of {history.length} messages has no line')
    segments = view_segments(history.line, history.length, history.through_message, bases)
    found = assemble(history.length, [_segment(transaction, query, segment) for segment in segments])
    if history.history_digest is not None:
        digests = [row[1] for row in found]
        if not all(isinstance(digest, str) for digest in digests) or history_digest(digests) != history.history_digest:
            raise ValueError('the messages found are not those of the history (its history_digest differs)')
    return found


def _segment(transaction: Transaction, query: Select[Any], segment: ViewSegment) -> dict[int, Any]:
    parameters = {'line': segment.line, 'length': segment.length, 'through': segment.through}
    return {row[0]: row for row in rows.fetch(transaction, query, parameters) if type(row[0]) is int}
