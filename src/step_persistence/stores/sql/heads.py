"""Where a run's next save starts: its head, the view of a stored snapshot (its anchor).

A head (`stores/_positions.py`: `RunHead`) is exactly the view of one stored snapshot: the run's
newest snapshot (of any state), or, before the run saved any, its origin snapshot
(`RunRecord.origin`, the previous turn of a chat), or no view at all (a run's first save then
starts a line). `read_head` finds it in the database, reading the view's digests through its
segments (`views.py`), except for an origin snapshot whose `history_digest` shows that the history
being saved starts with exactly its view: its digests are then the history's own, and no message
row is read (the next turn of a chat reads nothing that grows with the chat). A run's own view is
always read, so that rows damaged behind the store's back are written again rather than used.

The snapshot is the head's *anchor*: a save builds on the head only while the anchor is still
stored (`anchor_exists`, inside the save's transaction; on PostgreSQL its row is locked
`FOR KEY SHARE`, so that deleting it waits for the save to commit), because a stored view keeps the
rows it uses (see `reclaiming.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.sql import Select

from step_persistence._history import history_digest
from step_persistence._reading import logger
from step_persistence.stores._positions import RunHead
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.prepared import Prepared
from step_persistence.stores.sql.rows import RUN_KEY
from step_persistence.stores.sql.schema import messages, runs, snapshots
from step_persistence.stores.sql.views import LineBases, segment_query, view_rows

__all__ = ['Anchor', 'KnownHead', 'anchor_exists', 'read_head', 'require_key']


@dataclass(frozen=True, slots=True)
class Anchor:
    """The stored snapshot whose view a head is."""

    run_id: str
    seq: int


@dataclass
class KnownHead:
    """A run's head and its anchor (`None`: the head has no line, and needs no anchor)."""

    head: RunHead
    anchor: Anchor | None = None
    checked: bool = field(default=False, compare=False)
    """Whether the anchor is known to be stored in the transaction at hand (written or locked in it)."""

    def copy(self) -> KnownHead:
        """An independent copy, not checked in any transaction."""
        return KnownHead(self.head.copy(), self.anchor)


_RUN = select(runs.c.id, runs.c.origin_run_id, runs.c.origin_seq).where(runs.c.run_id == bindparam(RUN_KEY))
_VIEW_COLUMNS = (
    snapshots.c.run_id,
    snapshots.c.seq,
    snapshots.c.line_id,
    snapshots.c.history_length,
    snapshots.c.through_message,
    snapshots.c.history_digest,
)
_NEWEST = (
    select(*_VIEW_COLUMNS).where(snapshots.c.run_id == bindparam(RUN_KEY)).order_by(snapshots.c.seq.desc()).limit(1)
)
_SNAPSHOT = select(*_VIEW_COLUMNS).where(
    snapshots.c.run_id == bindparam('anchor_run'), snapshots.c.seq == bindparam('anchor_seq')
)
_DIGESTS = segment_query(messages.c.digest)
_ANCHOR = Prepared(
    select(snapshots.c.seq)
    .where(snapshots.c.run_id == bindparam('anchor_run'), snapshots.c.seq == bindparam('anchor_seq'))
    .with_for_update(read=True, key_share=True)
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def require_key(run_id: str, run_pk: object) -> int:
    """`runs.id` of the run, as an integer; `ValueError` for a damaged row (SQLite keeps any value in any column)."""
    if not _is_int(run_pk):
        raise ValueError(f'run {run_id!r} is damaged: its row holds {run_pk!r} as its key')
    return run_pk  # type: ignore[return-value]


def anchor_exists(transaction: Transaction, anchor: Anchor) -> bool:
    """Whether the anchor is still stored; on PostgreSQL its row stays locked (`FOR KEY SHARE`) until commit."""
    found = transaction.execute(_ANCHOR, {'anchor_run': anchor.run_id, 'anchor_seq': anchor.seq}).first()
    return found is not None


def read_head(transaction: Transaction, run_id: str, digests: Sequence[str] | None, *, lock: bool) -> KnownHead | None:
    """The run's head as stored; `None` for an unknown run.

    `digests`: those of the history the next save stores (for the `history_digest` shortcut of an
    origin's view), if known. With `lock` (inside a write transaction), the anchor's row is locked as
    by `anchor_exists`. A view that cannot be read (damaged or removed rows, damaged fields) gives a
    head without a line (logged): the next save stores its whole history again.
    """
    found = rows.fetch(transaction, _RUN, {RUN_KEY: run_id})
    if not found:
        return None
    run_pk, origin_run, origin_seq = found[0]
    incarnation = require_key(run_id, run_pk)
    view = _first(transaction, _NEWEST, {RUN_KEY: run_id}, lock=lock)
    if view is None and isinstance(origin_run, str) and _is_int(origin_seq):
        view = _first(transaction, _SNAPSHOT, {'anchor_run': origin_run, 'anchor_seq': origin_seq}, lock=lock)
    else:
        digests = None  # the run's own view is read: a save next to it must see its rows as they are
    if view is None:
        return KnownHead(RunHead(incarnation=incarnation))
    try:
        return _head_of_view(transaction, incarnation, view, digests, checked=lock)
    except ValueError as error:
        logger.warning('the history of run %r is stored again: its newest view cannot be read (%r)', run_id, error)
        return KnownHead(RunHead(incarnation=incarnation))


def _first(transaction: Transaction, query: Select[Any], parameters: Mapping[str, Any], *, lock: bool) -> Any:
    statement = query.with_for_update(read=True, key_share=True) if lock else query
    found = rows.fetch(transaction, statement, parameters)
    return found[0] if found else None


def _head_of_view(
    transaction: Transaction, incarnation: int, view: Any, digests: Sequence[str] | None, *, checked: bool
) -> KnownHead:
    anchor_run, seq, line, length, through, stored_digest = view
    if not (_is_int(seq) and isinstance(anchor_run, str)):
        raise ValueError(f'damaged snapshot key {(anchor_run, seq)!r}')
    history = rows.view_of(line, length, through, stored_digest)
    anchor = Anchor(run_id=anchor_run, seq=seq)
    if history.line is None or history.length == 0:
        empty = RunHead(incarnation=incarnation, line=history.line, last_no=history.through_message)
        return KnownHead(empty, anchor, checked)
    prefix = digests[: history.length] if digests is not None and len(digests) >= history.length else None
    if prefix is not None and stored_digest == history_digest(prefix):
        latest: list[str | None] = list(prefix)
    else:  # the rows' digests are checked against the stored history_digest by `view_rows`
        found = view_rows(transaction, history, _DIGESTS, LineBases(transaction))
        latest = [digest if isinstance(digest, str) else None for _, digest in found]
    head = RunHead(incarnation=incarnation, line=history.line, last_no=history.through_message, latest=latest)
    return KnownHead(head, anchor, checked)
