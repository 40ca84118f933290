"""The queries of `list_runs` and `find_snapshot`, each answered from an index of `schema.py`.

`list_runs` orders by `(started_at, id)` (descending for `newest_first`) with SQL's `LIMIT`: one
filter reads its index in order (`ix_runs_<filter>_started_at_id`, or `ix_runs_started_at_id`
without one), so the first `limit` rows end the read; a `run_id_prefix` alone scans the runs' ids.
`find_snapshot` finds the conversation's snapshots of one history through
`ix_snapshots_conversation_id_history_digest` (a handful of rows) and orders them by their runs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.sql import Select

from step_persistence.stores._listing import RunFilter
from step_persistence.stores.sql import rows
from step_persistence.stores.sql.schema import runs, snapshots

__all__ = ['runs_query', 'snapshots_of_history']


def runs_query(chosen: RunFilter) -> Select[Any]:
    """The runs `chosen` selects, in `list_runs` order, limited."""
    statement = select(*rows.RUN_COLUMNS)
    for name, column in (
        ('parent_run_id', runs.c.parent_run_id),
        ('conversation_id', runs.c.conversation_id),
        ('agent_name', runs.c.agent_name),
        ('origin_run_id', runs.c.origin_run_id),
    ):
        value = getattr(chosen, name)
        if value is not None:
            statement = statement.where(column == value)
    if chosen.run_id_prefix:
        prefix = chosen.run_id_prefix
        # LIKE finds the candidates (case-insensitive on SQLite), the substring keeps the exact ones.
        statement = statement.where(
            runs.c.run_id.startswith(prefix, autoescape=True), func.substr(runs.c.run_id, 1, len(prefix)) == prefix
        )
    order = (runs.c.started_at, runs.c.id)
    statement = statement.order_by(*(column.desc() for column in order) if chosen.newest_first else order)
    return statement if chosen.limit is None else statement.limit(chosen.limit)


def snapshots_of_history(conversation_id: str, history_digest: str) -> Select[Any]:
    """`(run_id, seq)` of the snapshots with that history in the conversation (theirs and their run's), newest
    first: the newest run (`list_runs` order), then the highest `seq`."""
    return (
        select(snapshots.c.run_id, snapshots.c.seq)
        .join(runs, runs.c.run_id == snapshots.c.run_id)
        .where(
            snapshots.c.conversation_id == conversation_id,
            snapshots.c.history_digest == history_digest,
            runs.c.conversation_id == conversation_id,
        )
        .order_by(runs.c.started_at.desc(), runs.c.id.desc(), snapshots.c.seq.desc())
    )
