"""`collect_media` for the SQL stores: unused message versions in one `DELETE`, then unreferenced blobs.

A message row is kept while it is its position's newest version in its run (the next save of the
run may reuse it) or some snapshot of the run uses it: the snapshot's history covers its position
(`history_length > position`) and its `through_message` lies between the row's number and the
next version's. Everything else goes in one `DELETE ... WHERE NOT EXISTS` over the indexed
`(run_id, position, no)` and the snapshots' primary key, in one transaction: a snapshot and the
rows it uses commit together, and a new snapshot only ever uses newest versions, so no grace
period is needed for messages.

Blobs are then collected through the store's media store (`collect_blobs`), with the URIs written
in the remaining externalized message rows as the references.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Delete, Text, and_, cast, delete, exists, func, select

from step_persistence.media.protocol import MediaStore
from step_persistence.reclaiming import MediaCollection, collect_blobs, uris_in, validate_grace
from step_persistence.stores.sql.database import Database
from step_persistence.stores.sql.executors import Transaction
from step_persistence.stores.sql.rows import fetch
from step_persistence.stores.sql.schema import messages, snapshots

__all__ = ['collect_media']


def _unused_messages() -> Delete:
    newer = messages.alias('newer')
    next_version = (
        select(func.min(newer.c.no))
        .where(newer.c.run_id == messages.c.run_id, newer.c.position == messages.c.position, newer.c.no > messages.c.no)
        .correlate(messages)  # the row being deleted, two levels out
        .scalar_subquery()
    )
    superseded = exists().where(
        newer.c.run_id == messages.c.run_id, newer.c.position == messages.c.position, newer.c.no > messages.c.no
    )
    used = exists().where(
        snapshots.c.run_id == messages.c.run_id,
        snapshots.c.history_length > messages.c.position,
        snapshots.c.through_message >= messages.c.no,
        snapshots.c.through_message < next_version,
    )
    return delete(messages).where(and_(superseded, ~used))


_DELETE_UNUSED = _unused_messages()
_EXTERNALIZED_BODIES = select(cast(messages.c.body, Text)).where(messages.c.externalized.is_(True))


def _delete_unused(transaction: Transaction) -> int:
    return int(transaction.execute(_DELETE_UNUSED).rowcount)


def _references(transaction: Transaction) -> set[str]:
    found: set[str] = set()
    for (body,) in fetch(transaction, _EXTERNALIZED_BODIES):
        if isinstance(body, str):  # a body that is not text (damaged: `Unreadable`) refers to nothing readable
            found |= uris_in(body)
    return found


async def collect_media(database: Database, media_store: MediaStore | None, *, grace: timedelta) -> MediaCollection:
    """Delete unused message rows, then the blobs of `media_store` no remaining row refers to."""
    grace = validate_grace(grace)
    reclaimed = await database.run(_delete_unused, write=True)

    async def referenced() -> set[str]:
        return await database.run(_references, write=False)

    blobs = await collect_blobs(media_store, grace=grace, referenced=referenced)
    return MediaCollection(messages=reclaimed, blobs=blobs)
