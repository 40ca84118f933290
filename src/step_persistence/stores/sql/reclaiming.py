"""Reclaiming message rows no view uses: after a delete (bounded by the lines it touched), and `collect_media`.

A row `(line, no, position)` is used while a view of its line uses it: a retained snapshot's
(`line_id`, `history_length`, `through_message`), or the base view of a line branching from it (a
child line keeps its base alive). A view `(length, through)` uses the row when `position < length`
and `no <= through` with no other row of the position numbered in between (`_USED`: two correlated
`EXISTS`, over `ix_snapshots_line_id_through_message` and
`ix_history_lines_base_line_id_base_through`, the next version found through
`ix_messages_line_id_position_no`).

`release_lines`, in the transaction of `delete_run` (after its snapshots are gone): a line left
with no snapshot and no child line goes whole, rows and line, and its base line is looked at in
turn; on any other line, the rows no remaining view uses go among those numbered up to the highest
`through` of the views removed from it (a row above belongs to a save nobody deleted) and above
the newest remaining view at or below that `through` (the rows that view reaches are its own, but
in a history that shrank). What is left unused either way is `collect_media`'s. So deleting one
run of a long chat reads the rows of its own turns only, and `delete_conversation` (newest first)
reads each row once.

`collect_media` deletes, in one transaction, every line without views (repeatedly: removing a
child can leave its base without views), then every row no view uses. A snapshot commits with the
rows it uses, so no grace period is needed for messages. Blobs are then collected through the
store's media store (`collect_blobs`), with the URIs written in the remaining externalized message
rows as the references.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import BigInteger, Text, bindparam, cast, delete, exists, func, literal_column, or_, select
from sqlalchemy.sql.elements import BindParameter

from step_persistence.media.protocol import MediaStore
from step_persistence.media.walker import MARKER_KEY
from step_persistence.reclaiming import MediaCollection, collect_blobs, uris_in, validate_grace
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.rows import RUN_KEY, fetch
from step_persistence.stores.sql.schema import durable_units, history_lines, messages, snapshots

__all__ = ['collect_media', 'lines_of_run', 'release_lines']

_NEVER = literal_column(str(2**63 - 1), BigInteger)
"""Above every row number: the bound of a row that has no newer version."""


def _used() -> object:
    newer = messages.alias('newer')
    next_version = func.coalesce(
        select(func.min(newer.c.no))
        .where(
            newer.c.line_id == messages.c.line_id, newer.c.position == messages.c.position, newer.c.no > messages.c.no
        )
        .correlate(messages)  # the row being deleted, two levels out
        .scalar_subquery(),
        _NEVER,
    )
    child = history_lines.alias('child')
    by_snapshot = exists().where(
        snapshots.c.line_id == messages.c.line_id,
        snapshots.c.through_message >= messages.c.no,
        snapshots.c.through_message < next_version,
        snapshots.c.history_length > messages.c.position,
    )
    by_branch = exists().where(
        child.c.base_line_id == messages.c.line_id,
        child.c.base_through >= messages.c.no,
        child.c.base_through < next_version,
        child.c.base_length > messages.c.position,
    )
    return or_(by_snapshot, by_branch)


_USED = _used()
_LINES_OF_RUN = (
    select(snapshots.c.line_id, func.max(snapshots.c.through_message))
    .where(snapshots.c.run_id == bindparam(RUN_KEY), snapshots.c.line_id.is_not(None))
    .group_by(snapshots.c.line_id)
)
_LINE: BindParameter[Any] = bindparam('line')
_VIEWED = select(
    or_(
        exists().where(snapshots.c.line_id == _LINE),
        exists().where(history_lines.c.base_line_id == _LINE),
    )
)
_BASE = select(history_lines.c.base_line_id, history_lines.c.base_through).where(history_lines.c.id == _LINE)
_DELETE_LINE_ROWS = delete(messages).where(messages.c.line_id == _LINE)
_DELETE_LINE = delete(history_lines).where(history_lines.c.id == _LINE)
_THRESHOLD: BindParameter[Any] = bindparam('threshold')
_VIEWS_BELOW = select(
    select(func.max(snapshots.c.through_message))
    .where(snapshots.c.line_id == _LINE, snapshots.c.through_message <= _THRESHOLD)
    .scalar_subquery(),
    select(func.max(history_lines.c.base_through))
    .where(history_lines.c.base_line_id == _LINE, history_lines.c.base_through <= _THRESHOLD)
    .scalar_subquery(),
)
_DELETE_RELEASED = delete(messages).where(
    messages.c.line_id == _LINE,
    messages.c.no > bindparam('lower'),
    messages.c.no <= _THRESHOLD,
    ~_USED,  # type: ignore[operator]
)
_DELETE_UNVIEWED_LINES = delete(history_lines).where(
    ~exists().where(snapshots.c.line_id == history_lines.c.id),
    ~exists().where(history_lines.alias('child').c.base_line_id == history_lines.c.id),
)
_DELETE_UNUSED = delete(messages).where(~_USED)  # type: ignore[operator]
_EXTERNALIZED_BODIES = select(cast(messages.c.body, Text)).where(messages.c.externalized.is_(True))
_EXTERNALIZED_RESULTS = select(cast(durable_units.c.result, Text)).where(
    cast(durable_units.c.result, Text).contains(MARKER_KEY, autoescape=True)
)
"""The durable journal's unit results that hold media markers (`{'value': ..., 'externalized': true}`)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def lines_of_run(transaction: Transaction, run_id: str) -> dict[int, int]:
    """The lines the run's snapshots are on, each with the highest `through_message` of those snapshots."""
    found = fetch(transaction, _LINES_OF_RUN, {RUN_KEY: run_id})
    return {line: through for line, through in found if _is_int(line) and _is_int(through)}


def release_lines(transaction: Transaction, released: dict[int, int]) -> int:
    """Reclaim the rows of `released` lines (line -> highest `through` of the views just removed from it) that
    no view uses any more; returns how many rows went (see the module docstring)."""
    pending = dict(released)
    reclaimed = 0
    while pending:
        line, threshold = pending.popitem()
        parameters = {'line': line}
        if transaction.execute(_VIEWED, parameters).scalar():
            parameters['threshold'] = threshold
            below = fetch(transaction, _VIEWS_BELOW, parameters)[0]
            parameters['lower'] = max((through for through in below if _is_int(through)), default=0)
            reclaimed += int(transaction.execute(_DELETE_RELEASED, parameters).rowcount)
            continue
        base = fetch(transaction, _BASE, parameters)
        reclaimed += int(transaction.execute(_DELETE_LINE_ROWS, parameters).rowcount)
        transaction.execute(_DELETE_LINE, parameters)
        if base and _is_int(base[0][0]) and _is_int(base[0][1]):
            base_line, base_through = base[0]
            pending[base_line] = max(pending.get(base_line, 0), base_through)
    return reclaimed


def _delete_unused(transaction: Transaction) -> int:
    while transaction.execute(_DELETE_UNVIEWED_LINES).rowcount:
        pass
    return int(transaction.execute(_DELETE_UNUSED).rowcount)


def _references(transaction: Transaction) -> set[str]:
    found: set[str] = set()
    for statement in (_EXTERNALIZED_BODIES, _EXTERNALIZED_RESULTS):
        for (body,) in fetch(transaction, statement):
            if isinstance(body, str):  # a body that is not text (damaged: `Unreadable`) refers to nothing readable
                found |= uris_in(body)
    return found


async def collect_media(database: Database, media_store: MediaStore | None, *, grace: timedelta) -> MediaCollection:
    """Delete lines without views and unused message rows, then the blobs of `media_store` no remaining row
    refers to."""
    grace = validate_grace(grace)
    reclaimed = await database.run(_delete_unused, write=True)

    async def referenced() -> set[str]:
        return await database.run(_references, write=False)

    blobs = await collect_blobs(media_store, grace=grace, referenced=referenced)
    return MediaCollection(messages=reclaimed, blobs=blobs)
